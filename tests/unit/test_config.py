"""Settings from the environment: SAGA_* values read and converted, bad values refused with the
variable named, explicit overrides winning."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from saga_shared.config import Settings
from saga_shared.errors import ConfigError


def test_defaults_with_an_empty_environment() -> None:
    s = Settings.from_env({})

    assert s == Settings()
    assert s.namespace == "saga"
    assert s.partitions == 8
    assert s.amqp_url.startswith("amqp://")
    assert s.database_url.startswith("postgresql://")


def test_reads_every_saga_variable_and_converts_its_type() -> None:
    env = {
        "SAGA_AMQP_URL": "amqp://u:p@broker:5672/vh",
        "SAGA_DATABASE_URL": "postgresql://db/saga",
        "SAGA_NAMESPACE": "prod-eu_1",
        "SAGA_PARTITIONS": "16",
        "SAGA_DELIVERY_LIMIT": "7",
        "SAGA_CATALOG_PATH": "/etc/saga/catalog.toml",
        "SAGA_MAX_MESSAGE_BYTES": "4096",
        "SAGA_PUBLISH_TIMEOUT_S": "2.5",
        "SAGA_ADAPTER_PREFETCH": "4",
        "SAGA_PARTITION_PREFETCH": "8",
        "SAGA_RELAY_BATCH": "50",
        "SAGA_RELAY_POLL_S": "0.25",
    }

    s = Settings.from_env(env)

    assert s == Settings(
        amqp_url="amqp://u:p@broker:5672/vh",
        database_url="postgresql://db/saga",
        namespace="prod-eu_1",
        partitions=16,
        delivery_limit=7,
        catalog_path="/etc/saga/catalog.toml",
        max_message_bytes=4096,
        publish_timeout_s=2.5,
        adapter_prefetch=4,
        partition_prefetch=8,
        relay_batch=50,
        relay_poll_s=0.25,
    )
    assert isinstance(s.partitions, int)
    assert isinstance(s.publish_timeout_s, float)


def test_a_float_setting_accepts_an_integer_string() -> None:
    assert Settings.from_env({"SAGA_PUBLISH_TIMEOUT_S": "3"}).publish_timeout_s == 3.0


def test_variables_without_the_prefix_or_unknown_are_ignored() -> None:
    s = Settings.from_env({"PARTITIONS": "3", "SAGA_COLOUR": "red", "saga_partitions": "3"})

    assert s == Settings()


def test_reads_the_process_environment_when_no_mapping_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SAGA_PARTITIONS", "12")
    monkeypatch.setenv("SAGA_NAMESPACE", "from-env")

    s = Settings.from_env()

    assert (s.partitions, s.namespace) == (12, "from-env")


@pytest.mark.parametrize(
    ("variable", "value", "kind"),
    [
        ("SAGA_PARTITIONS", "eight", "int"),
        ("SAGA_PARTITIONS", "8.0", "int"),
        ("SAGA_DELIVERY_LIMIT", "", "int"),
        ("SAGA_PUBLISH_TIMEOUT_S", "soon", "float"),
        ("SAGA_RELAY_POLL_S", "1,5", "float"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_the_variable(
    variable: str, value: str, kind: str
) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({variable: value})

    message = str(info.value)
    assert message.startswith(f"{variable}=")
    assert repr(value) in message
    assert f"expected a {kind}" in message


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SAGA_PARTITIONS", "0"),
        ("SAGA_PARTITIONS", "1025"),
        ("SAGA_PARTITIONS", "-3"),
        ("SAGA_DELIVERY_LIMIT", "0"),
        ("SAGA_DELIVERY_LIMIT", "1001"),
        ("SAGA_MAX_MESSAGE_BYTES", "1023"),
        ("SAGA_NAMESPACE", "Prod"),
        ("SAGA_NAMESPACE", "9lives"),
        ("SAGA_NAMESPACE", "has space"),
        ("SAGA_NAMESPACE", "a" * 42),
        ("SAGA_NAMESPACE", ""),
    ],
)
def test_a_value_out_of_range_is_refused_naming_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({variable: value})

    assert variable in str(info.value)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SAGA_PARTITIONS", "1"),
        ("SAGA_PARTITIONS", "1024"),
        ("SAGA_DELIVERY_LIMIT", "1"),
        ("SAGA_DELIVERY_LIMIT", "1000"),
        ("SAGA_MAX_MESSAGE_BYTES", "1024"),
        ("SAGA_NAMESPACE", "a" * 41),
        ("SAGA_NAMESPACE", "t1a2b3c4-x_y"),
    ],
)
def test_values_at_the_edges_of_the_range_are_accepted(variable: str, value: str) -> None:
    Settings.from_env({variable: value})


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        # the relay would fetch LIMIT 0 rows forever: nothing is ever published
        ("SAGA_RELAY_BATCH", "0"),
        # every publish would time out at once
        ("SAGA_PUBLISH_TIMEOUT_S", "0"),
        ("SAGA_PUBLISH_TIMEOUT_S", "-1"),
        # a negative poll interval turns the relay's wait into a busy loop
        ("SAGA_RELAY_POLL_S", "-1"),
        # AMQP prefetch counts are unsigned
        ("SAGA_ADAPTER_PREFETCH", "-1"),
        ("SAGA_PARTITION_PREFETCH", "-1"),
    ],
)
def test_nonsensical_tuning_values_are_refused_naming_the_variable(
    variable: str, value: str
) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({variable: value})

    assert variable in str(info.value)


def test_overrides_win_over_the_environment() -> None:
    s = Settings.from_env(
        {"SAGA_PARTITIONS": "16", "SAGA_NAMESPACE": "env"}, partitions=2, namespace="cli"
    )

    assert (s.partitions, s.namespace) == (2, "cli")


def test_none_overrides_leave_the_environment_value() -> None:
    s = Settings.from_env({"SAGA_PARTITIONS": "16"}, partitions=None, namespace=None)

    assert (s.partitions, s.namespace) == (16, "saga")


def test_overrides_are_checked_too() -> None:
    with pytest.raises(ConfigError, match="SAGA_PARTITIONS"):
        Settings.from_env({}, partitions=0)


def test_a_bad_environment_value_is_refused_even_when_overridden() -> None:
    # the environment is read in full before overrides apply: a typo there never hides
    with pytest.raises(ConfigError, match="SAGA_PARTITIONS"):
        Settings.from_env({"SAGA_PARTITIONS": "many"}, partitions=4)


def test_with_returns_a_changed_copy_and_checks_it() -> None:
    s = Settings()
    t = s.with_(partitions=3)

    assert (s.partitions, t.partitions) == (8, 3)
    with pytest.raises(ConfigError, match="SAGA_NAMESPACE"):
        s.with_(namespace="Bad Name")


def test_catalog_file_defaults_to_the_shipped_catalog() -> None:
    path = Settings().catalog_file

    assert path.name == "catalog.toml"
    assert path.parent.name == "saga_shared"  # the installed name (a link to shared/ here)
    assert path.is_file()


def test_catalog_file_follows_the_setting(tmp_path: Path) -> None:
    target = tmp_path / "mine.toml"

    s = Settings.from_env({"SAGA_CATALOG_PATH": str(target)})

    assert s.catalog_file == target


def test_events_select_which_lifecycle_events_are_published() -> None:
    from saga_shared.transport.topology import Topology

    lifecycle = Topology.from_settings(Settings.from_env({"SAGA_EVENTS": "saga.*, step.failed"}))
    default = Topology.from_settings(Settings())
    everything = Topology.from_settings(Settings(events="*"))

    assert lifecycle.publishes("saga.completed") and lifecycle.publishes("step.failed")
    assert not lifecycle.publishes("step.started") and not lifecycle.publishes("step.done")
    assert default.publishes("saga.needs_human") and not default.publishes("step.started")
    assert everything.publishes("step.started")
    assert not Topology.from_settings(Settings(events="")).publishes("saga.completed")


def test_an_event_pattern_matching_nothing_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"SAGA_EVENTS: 'sage\.\*' matches no event type"):
        Settings.from_env({"SAGA_EVENTS": "saga.completed,sage.*"})


def test_the_in_process_hand_off_needs_the_shared_identity() -> None:
    """A handed-over message skips the broker's check of who sent it (rule 11)."""
    shared = Settings.from_env({"SAGA_HANDOFF": "in-process", "SAGA_IDENTITY": "shared"})
    assert shared.handoff == "in-process"
    assert Settings().handoff == "broker"
    with pytest.raises(ConfigError, match=r"SAGA_HANDOFF=in-process needs SAGA_IDENTITY=shared"):
        Settings.from_env({"SAGA_HANDOFF": "in-process"})  # roles, the default
    with pytest.raises(ConfigError, match=r"SAGA_HANDOFF='local': Input should be 'broker' or"):
        Settings.from_env({"SAGA_HANDOFF": "local", "SAGA_IDENTITY": "shared"})


def test_a_coordinator_share_is_k_of_n() -> None:
    from saga_coordinator.coordinator import share_of

    assert share_of(Settings(coordinator_share="1/3").coordinator_share, range(8)) == (
        [1, 4, 7],
        [0, 2, 3, 5, 6],
    )
    assert share_of("0/1", range(4)) == ([0, 1, 2, 3], [])
    for bad in ("2/2", "1", "a/b", "0/0"):
        with pytest.raises(ConfigError, match="SAGA_COORDINATOR_SHARE"):
            Settings(coordinator_share=bad)


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("SAGA_AMQP_URL", "notaurl", "scheme must be one of amqp, amqps"),
        ("SAGA_AMQP_URL", "http://broker/", "scheme must be one of amqp, amqps"),
        ("SAGA_AMQP_URL", "amqp://u:hunter2@h:99999/", "Port out of range"),
        ("SAGA_AMQP_URL", "amqp:///vhost", "no host"),
        ("SAGA_DATABASE_URL", "mysql://db/saga", "scheme must be one of postgresql"),
        ("SAGA_DATABASE_URL", "postgresql://u:hunter2@db:x/saga", "Port could not be cast"),
        ("SAGA_DATABASE_URL", "postgresql://u:hunter2@db/saga?sslmode=bogus", "sslmode='bogus'"),
        # aiormq would read each as no heartbeat: a frozen coordinator kept its partitions.
        ("SAGA_AMQP_URL", "amqp://u:hunter2@h/?heartbeat=abc", "heartbeat='abc'"),
        ("SAGA_AMQP_URL", "amqp://u:hunter2@h/?heartbeat=-5", "heartbeat='-5'"),
        ("SAGA_AMQP_URL", "amqp://u:hunter2@h/?heartbeat=0", "heartbeat='0'"),
    ],
)
def test_a_url_the_clients_cannot_use_is_refused_without_showing_its_password(
    variable: str, value: str, words: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({variable: value})
    assert words in str(refused.value) and variable in str(refused.value)
    assert "hunter2" not in str(refused.value)


def test_tls_and_socket_urls_are_accepted() -> None:
    Settings(amqp_url="amqps://u:p@broker:5671/v?cafile=/etc/ca.pem")
    Settings(database_url="postgresql:///saga?host=/var/run/postgresql")
    Settings(database_url="postgresql://db/saga?sslmode=verify-full&sslrootcert=/etc/ca.pem")


def test_a_constructed_settings_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # tests and the test kit build Settings(...) and must not pick up a developer's exports
    monkeypatch.setenv("SAGA_PARTITIONS", "12")
    monkeypatch.setenv("SAGA_IDENTITY", "shared")

    assert Settings() == Settings.from_env({})
    assert Settings.from_env().partitions == 12


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"SAGA_PARTITIONS": "x"}, "SAGA_PARTITIONS='x': expected a int"),
        ({"SAGA_PARTITIONS": "0"}, "SAGA_PARTITIONS='0': must be between 1 and 1024"),
        ({"SAGA_RELAY_POLL_S": "nan"}, "SAGA_RELAY_POLL_S='nan': must be more than 0"),
        ({"SAGA_IDENTITY": "trust"}, "SAGA_IDENTITY='trust': Input should be 'roles' or 'shared'"),
        ({"SAGA_PEOPLE": "ana,bob smith"}, "SAGA_PEOPLE: 'bob smith' is not a user name"),
        ({"SAGA_AGENT_BURST": "0"}, "SAGA_AGENT_BURST='0': must be between 1 and 1000000"),
    ],
)
def test_a_refusal_is_one_line_naming_the_variable_the_value_and_the_rule(
    env: dict[str, str], said: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env(env)

    assert str(refused.value).startswith(said)
    assert "\n" not in str(refused.value)


def test_every_bad_value_is_named_at_once() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"SAGA_NAMESPACE": "Bad", "SAGA_PARTITIONS": "0"})

    message = str(refused.value)
    assert "SAGA_NAMESPACE='Bad'" in message and "SAGA_PARTITIONS='0'" in message
    assert "\n" not in message


def test_a_10000_digit_number_is_refused_in_a_short_line() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"SAGA_PARTITIONS": "9" * 10_000})

    message = str(refused.value)
    assert message.startswith("SAGA_PARTITIONS='999") and message.endswith("expected a int")
    assert len(message) < 200


@pytest.mark.parametrize("char", ["\x00", "\x07", "\x1b", "\t", "\n", "\x7f", "\x85"])
def test_a_url_with_a_control_character_is_refused(char: str) -> None:
    # urllib would drop a tab or a newline without a word: the URL used is not the one written
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"SAGA_AMQP_URL": f"amqp://u:hunter2@broker{char}:5672/"})

    message = str(refused.value)
    assert message.startswith("SAGA_AMQP_URL=") and "a control character" in message
    assert "hunter2" not in message and char not in message


def test_a_url_urllib_cannot_read_is_refused_without_its_password() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"SAGA_DATABASE_URL": "postgresql://u:hunter2@[db/saga"})

    assert "SAGA_DATABASE_URL" in str(refused.value) and "hunter2" not in str(refused.value)


def test_an_unknown_setting_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="SAGA_COLOUR='red': there is no such setting"):
        Settings(colour="red")  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="SAGA_COLOUR"):
        Settings().with_(colour="red")


def test_a_count_given_as_a_float_or_a_bool_is_refused() -> None:
    for value in (4.5, True):
        with pytest.raises(ConfigError, match="SAGA_PARTITIONS"):
            Settings(partitions=value)


def test_settings_are_frozen_and_hashable() -> None:
    s = Settings()

    with pytest.raises(ValidationError):
        s.partitions = 3  # type: ignore[misc]
    assert hash(s) == hash(Settings()) and s.with_(partitions=3) != s


def test_the_plan_cache_mode_is_one_of_postgres_values() -> None:
    assert Settings().db_plan_cache_mode == "force_generic_plan"
    assert Settings.from_env({"SAGA_DB_PLAN_CACHE_MODE": "auto"}).db_plan_cache_mode == "auto"
    # Anything else would reach Postgres as a startup parameter and fail every connection.
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"SAGA_DB_PLAN_CACHE_MODE": "auto; DROP TABLE sagas"})

    assert "SAGA_DB_PLAN_CACHE_MODE" in str(info.value)
