"""The acceptance service's second face: gRPC ``fatura.jobs.v1.JobService`` for internal callers, on the
same code as the HTTP job routes (``fatura run jobs-grpc``)."""
