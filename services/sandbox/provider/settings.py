"""Settings of the simulated provider (``fatura sandbox provider``), read once from ``FATURA_*``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from services.common.settings import SettingsError, env_float, env_int, env_set, env_str, env_switch
from services.sandbox.provider.vllm import EngineConfig

Distribution = Literal["fixed", "exponential", "lognormal"]
Mode = Literal["openai", "vllm"]
DISTRIBUTIONS: tuple[Distribution, ...] = ("fixed", "exponential", "lognormal")


@dataclass(frozen=True)
class ProviderSettings:
    host: str = "127.0.0.1"
    port: int = 8090
    rpm: int = 0  # requests per sliding 60 s; 0 = unlimited
    tpm: int = 0  # prompt + completion tokens per sliding 60 s; 0 = unlimited
    concurrency: int = 0  # requests in progress at once; 0 = unlimited
    # RPM and TPM also quantized per second: no sliding second admits more than RPM/60 or TPM/60
    per_second: bool = False
    latency_ms: float = 0.0  # mean added latency before the answer
    latency_distribution: Distribution = "fixed"
    api_key: str | None = None  # None: any bearer key (or none) is accepted
    models: tuple[str, ...] = ("fatura-sim-1",)
    log_level: str = "INFO"
    # ``vllm``: answers come from a simulated vLLM engine under KV pressure (vllm.py)
    mode: Mode = "openai"
    engine: EngineConfig = field(default_factory=EngineConfig)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ProviderSettings:
        env = os.environ if env is None else env
        distribution = env_str(env, "FATURA_SANDBOX_PROVIDER_LATENCY_DISTRIBUTION", "fixed").lower()
        if distribution not in DISTRIBUTIONS:
            raise SettingsError(
                f"FATURA_SANDBOX_PROVIDER_LATENCY_DISTRIBUTION={distribution!r} is not one of "
                + ", ".join(DISTRIBUTIONS)
            )
        models = tuple(sorted(env_set(env, "FATURA_SANDBOX_PROVIDER_MODELS"))) or cls.models
        api_key = env_str(env, "FATURA_SANDBOX_PROVIDER_API_KEY", "") or None
        level = env_str(env, "FATURA_LOG_LEVEL", "INFO").upper()
        mode = env_str(env, "FATURA_SANDBOX_PROVIDER_MODE", "openai").lower()
        if mode not in ("openai", "vllm"):
            raise SettingsError(f"FATURA_SANDBOX_PROVIDER_MODE={mode!r} is not one of openai, vllm")
        return cls(
            host=env_str(env, "FATURA_SANDBOX_PROVIDER_HOST", cls.host),
            port=env_int(env, "FATURA_SANDBOX_PROVIDER_PORT", cls.port, lo=1, hi=65535),
            rpm=env_int(env, "FATURA_SANDBOX_PROVIDER_RPM", 0, lo=0, hi=10_000_000),
            tpm=env_int(env, "FATURA_SANDBOX_PROVIDER_TPM", 0, lo=0, hi=10_000_000_000),
            concurrency=env_int(env, "FATURA_SANDBOX_PROVIDER_CONCURRENCY", 0, lo=0, hi=100_000),
            per_second=env_switch(env, "FATURA_SANDBOX_PROVIDER_PER_SECOND", False),
            latency_ms=env_float(env, "FATURA_SANDBOX_PROVIDER_LATENCY_MS", 0.0, lo=0.0, hi=600_000.0),
            latency_distribution=distribution,  # checked against DISTRIBUTIONS above
            api_key=api_key,
            models=models,
            log_level=level if level in {"DEBUG", "INFO", "WARNING", "ERROR"} else "INFO",
            mode="vllm" if mode == "vllm" else "openai",
            engine=_engine(env),
        )


def _engine(env: Mapping[str, str]) -> EngineConfig:
    d = EngineConfig()
    return EngineConfig(
        kv_blocks=env_int(env, "FATURA_SANDBOX_VLLM_KV_BLOCKS", d.kv_blocks, lo=1, hi=10_000_000),
        block_size=env_int(env, "FATURA_SANDBOX_VLLM_BLOCK_SIZE", d.block_size, lo=1, hi=1_024),
        max_num_seqs=env_int(env, "FATURA_SANDBOX_VLLM_MAX_NUM_SEQS", d.max_num_seqs, lo=1, hi=100_000),
        max_num_batched_tokens=env_int(
            env, "FATURA_SANDBOX_VLLM_MAX_NUM_BATCHED_TOKENS", d.max_num_batched_tokens, lo=1, hi=10_000_000
        ),
        step_base_s=env_float(env, "FATURA_SANDBOX_VLLM_STEP_MS", d.step_base_s * 1e3, lo=0.1, hi=10_000.0)
        / 1e3,
        prefill_s_per_token=env_float(
            env, "FATURA_SANDBOX_VLLM_PREFILL_US_PER_TOKEN", d.prefill_s_per_token * 1e6, lo=0.0, hi=1e6
        )
        / 1e6,
        decode_s_per_seq=env_float(
            env, "FATURA_SANDBOX_VLLM_DECODE_US_PER_SEQ", d.decode_s_per_seq * 1e6, lo=0.0, hi=1e6
        )
        / 1e6,
    )


def ready_url() -> str:
    settings = ProviderSettings.from_env()
    # a wildcard bind is reached on loopback; an IPv6 literal needs brackets in a URL
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(settings.host, settings.host)
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.port}/readyz"
