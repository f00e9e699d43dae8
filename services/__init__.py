"""Fatura: durable acceptance, LLM extraction and signed delivery of invoice documents."""
