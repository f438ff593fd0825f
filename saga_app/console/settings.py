"""The console's own settings (``SAGA_CONSOLE_*``), read from the environment."""

from __future__ import annotations

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from saga_shared.errors import ConfigError


class ConsoleSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SAGA_CONSOLE_", frozen=True, extra="ignore")

    bind: str = "127.0.0.1:8080"
    # The accounts file (TOML, see saga_app.console.accounts); no console starts without one.
    users: str = ""
    # Signs the session cookies. Without it each process makes its own: a restart signs
    # everyone out, and two console processes do not share sign-ins.
    secret: SecretStr = SecretStr("")
    # Send the session cookie over HTTPS only: set it when a TLS proxy stands in front.
    secure_cookie: bool = False
    session_hours: float = Field(default=8.0, gt=0, le=24 * 30)
    # A dead letter links to its trace in your trace UI: a URL with {trace_id} in it, e.g.
    # https://jaeger.example.com/trace/{trace_id} (empty: no link).
    trace_url: str = Field(
        default="", max_length=500, pattern=r"^(|https?://[^\s]*\{trace_id\}[^\s]*)$"
    )

    @classmethod
    def from_env(cls) -> ConsoleSettings:
        try:
            return cls()
        except ValidationError as exc:
            first = exc.errors(include_url=False, include_input=False)[0]
            name = "SAGA_CONSOLE_" + str(first["loc"][0]).upper() if first["loc"] else "?"
            raise ConfigError(f"{name}: {first['msg']}") from None
