"""The simulated OpenAI-compatible LLM provider of the sandbox (DESIGN §7).

``extract`` is its rule-based "model"; ``create_app`` the HTTP app; ``main`` runs it
(``fatura sandbox provider``).
"""

from services.sandbox.provider.app import create_app, create_app_from_env
from services.sandbox.provider.extract import extract
from services.sandbox.provider.server import main
from services.sandbox.provider.settings import ProviderSettings, ready_url

__all__ = ["ProviderSettings", "create_app", "create_app_from_env", "extract", "main", "ready_url"]
