"""The review workflow (DESIGN §5.13): a result that did not pass validation, or one an ERP
refused, waits for a human. Its routes are mounted by the edge under ``/v1/reviews``; a reviewer
key (bound to one tenant) opens them."""
