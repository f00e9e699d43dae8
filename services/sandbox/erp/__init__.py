"""The reference ERP receiver: a real HTTP server that receives Fatura's webhooks through fatura_sdk."""
