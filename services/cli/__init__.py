"""The ``fatura`` command line."""
