"""The sandbox: stand-ins for the outside world (model provider, ERP) and the sample invoices."""
