"""Catalog files: the shipped one passes, a copy loads, and a file that breaks a rule stops the
load with a message that says where."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from saga_shared.errors import CatalogError
from saga_shared.model.gateway import load_catalog
from tests.unit.factories import CATALOG_FILE, real_catalog


def test_the_shipped_catalog_passes_every_check() -> None:
    catalog = load_catalog(CATALOG_FILE)

    assert set(catalog.sagas) == {"refund", "checkout", "checkout_approved"}
    assert catalog.actions["payments.charge_card"].residue
    assert catalog.retry_policy("inventory.release_stock").attempts == 5
    assert catalog.retry_policy("no.such").attempts == 3


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "catalog.toml"
    path.write_text(text, encoding="utf-8")
    return path


BASE_TOML = """
[actions."inventory.hold"]
class = "compensable"
compensation = "inventory.unhold"
result = ["hold_id"]

[actions."email.notify"]
class = "irreversible"

[actions."erp.check"]
class = "read_only"

[compensations."inventory.unhold"]
"""


def test_a_copy_of_the_shipped_catalog_loads(tmp_path: Path) -> None:
    path = tmp_path / "copy.toml"
    shutil.copy(CATALOG_FILE, path)

    assert load_catalog(path) == real_catalog()


def test_catalog_saga_breaking_a_plan_rule_names_the_saga_step_and_rule(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        BASE_TOML
        + """
[sagas.notify_first]
steps = ["erp.check", "email.notify", "inventory.hold"]
""",
    )

    with pytest.raises(CatalogError) as info:
        load_catalog(path)

    message = str(info.value)
    assert str(path) in message
    assert "notify_first" in message
    assert "step 1" in message
    assert "email.notify" in message
    assert "[irreversible_not_last]" in message


def test_catalog_saga_with_an_unknown_step_names_it(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        BASE_TOML
        + """
[sagas.oops]
steps = ["inventory.hold", "erp.teleport"]
""",
    )

    with pytest.raises(CatalogError) as info:
        load_catalog(path)

    message = str(info.value)
    assert "oops" in message
    assert "step 1" in message
    assert "erp.teleport" in message
    assert "[unknown_action]" in message


def test_catalog_saga_with_a_bad_priority_names_the_saga_and_rule(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        BASE_TOML
        + """
[sagas.prio]
steps = ["inventory.hold"]
compensation_priority = ["erp.check"]
""",
    )

    with pytest.raises(CatalogError) as info:
        load_catalog(path)

    assert "prio" in str(info.value)
    assert "[priority_unknown]" in str(info.value)


@pytest.mark.parametrize(
    ("action", "rule"),
    [
        ('[actions."inventory.grab"]\nclass = "compensable"\n', "compensation_missing"),
        (
            '[actions."inventory.grab"]\nclass = "compensable"\ncompensation = "inventory.x"\n',
            "compensation_unknown",
        ),
        (
            '[actions."payments.bill"]\nclass = "compensable_with_residue"\n'
            'compensation = "payments.unbill"\n[compensations."payments.unbill"]\n',
            "residue_missing",
        ),
    ],
    ids=["no-compensation", "unknown-compensation", "no-residue"],
)
def test_catalog_action_breaking_a_rule_names_the_action_and_rule(
    tmp_path: Path, action: str, rule: str
) -> None:
    path = write(tmp_path, BASE_TOML + "\n" + action)

    with pytest.raises(CatalogError) as info:
        load_catalog(path)

    message = str(info.value)
    assert f"[{rule}]" in message
    assert ("inventory.grab" in message) or ("payments.bill" in message)


def test_invalid_toml_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, '[actions."inventory.hold"\nclass = ')

    with pytest.raises(CatalogError) as info:
        load_catalog(path)

    assert "not valid TOML" in str(info.value)
    assert str(path) in str(info.value)


def test_unknown_field_is_refused_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path, BASE_TOML.replace('result = ["hold_id"]', 'colour = "red"'))

    with pytest.raises(CatalogError) as info:
        load_catalog(path)

    assert "actions.inventory.hold.colour" in str(info.value)
    assert "Extra inputs are not permitted" in str(info.value)


def test_unknown_action_class_is_refused_naming_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, BASE_TOML.replace('class = "read_only"', 'class = "harmless"'))

    with pytest.raises(CatalogError) as info:
        load_catalog(path)

    assert "actions.erp.check.class" in str(info.value)


def test_bad_param_type_in_the_catalog_is_refused(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        BASE_TOML + '\n[actions."erp.price"]\nclass = "read_only"\n'
        'params = { amount = "decimal" }\n',
    )

    with pytest.raises(CatalogError, match=r"actions\.erp\.price\.params\.amount"):
        load_catalog(path)


def test_missing_catalog_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.toml"

    with pytest.raises(CatalogError) as info:
        load_catalog(path)

    assert "cannot read" in str(info.value)
    assert str(path) in str(info.value)
