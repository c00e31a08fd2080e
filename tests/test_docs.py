"""The reference docs stay true: every setting, metric, command, route and link they name
exists, and everything that exists is in them. A rename in the code fails here until the
docs follow."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from prometheus_client import Metric
from prometheus_client.parser import text_string_to_metric_families

from daemon.admin.console.security import CSRF_COOKIE, SESSION_COOKIE
from daemon.cli import main as cli
from daemon.emulator import create_app
from daemon.settings import PREFIX, Settings, SettingsError, load_settings
from tests.account.support import RESET, rotation_settings
from tests.pipeline.support import RESUME_ALL, harness
from tests.support import emulator_config, running_recoveryd, workflows

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        ROOT / "ARCHITECTURE.md",
        ROOT / "examples" / "README.md",
        ROOT / "bench" / "README.md",
        ROOT / "helm" / "recoveryd" / "README.md",
        *DOCS.glob("*.md"),
    ]
)


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def every_page() -> str:
    return "\n".join(text(page) for page in PAGES if page.exists())


def table_rows(page: str) -> list[list[str]]:
    """The body rows of every Markdown table in `page`, as stripped cells (escaped `|`
    kept inside its cell)."""
    rows = []
    for line in page.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|[-| :]+\|", line):
            cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
            rows.append([cell.strip() for cell in cells])
    return rows


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def section(page: str, heading: str) -> str:
    """The text under `heading` up to the next heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    start = page.index(heading + "\n")
    following = re.compile(rf"^#{{1,{len(level)}}} ", re.MULTILINE)
    found = following.search(page, start + len(heading))
    return page[start : found.start() if found else len(page)]


# -- settings ---------------------------------------------------------------------------


def settings_table() -> dict[str, list[str]]:
    """docs/settings.md's table: variable -> [default, meaning]."""
    return {
        code_spans(row[0])[0]: row[1:]
        for row in table_rows(text(DOCS / "settings.md"))
        if row[0].startswith("`RECOVERYD_")
    }


def test_every_setting_is_documented_with_its_default() -> None:
    table = settings_table()
    assert sorted(table) == sorted(PREFIX + name for name in Settings.model_fields)
    base = {"RECOVERYD_TOKEN": "t", "RECOVERYD_SIGNING_KEY_CURRENT": "k"}
    for name, field in Settings.model_fields.items():
        if field.default in (None, ""):
            continue  # documented as required, none or off, in words
        default = code_spans(table[PREFIX + name][0])[0]
        parsed = load_settings({**base, PREFIX + name: default})
        assert getattr(parsed, name) == field.default, f"{PREFIX}{name}: docs say {default}"


def settings_errors(environ: dict[str, str]) -> str:
    try:
        load_settings(environ)
    except SettingsError as exc:
        return str(exc)
    return ""


def test_every_variable_the_docs_name_is_a_setting() -> None:
    pages = every_page()
    named = set(re.findall(r"\bRECOVERYD_[A-Z0-9_]*[A-Z0-9]\b", pages))
    for name in sorted(named):
        if f"{name}: not a recoveryd setting" in pages:
            continue  # the docs' own example of a typo
        assert f"{name}: not a recoveryd setting" not in settings_errors({name: "1"})


# -- metrics ----------------------------------------------------------------------------


def metrics_table() -> dict[str, tuple[str, set[str]]]:
    """docs/metrics.md's table: name -> (type, label names)."""
    return {
        code_spans(row[0])[0]: (row[1], set(code_spans(row[2])))
        for row in table_rows(text(DOCS / "metrics.md"))
        if row[0].startswith("`recoveryd_") and len(row) == 4
    }


def exported_name(family: Metric) -> str:
    return family.name + "_total" if family.type == "counter" else family.name


async def test_every_metric_a_running_daemon_exports_is_documented(tmp_path: Path) -> None:
    """A daemon that took callbacks, recovered runs and rotated its token, once well and
    once not (so that the gauges known only after a rotation's success and failure exist
    too): each family it exports is in the table with its type and labels, and the table
    has nothing else."""
    settings = rotation_settings(tmp_path / "credentials.json")
    async with harness(tmp_path, RESUME_ALL, **settings) as h:
        dlq_ids = await h.seed(workflows(3))
        await h.send_callbacks(dlq_ids)
        assert await h.settled(3) == {"done": 3}
        assert (await h.recoveryd.admin.post("/-/rotate-token", timeout=30)).status_code == 200
        await h.fault(kind="status", status=400, times=1, paths=[RESET])
        assert (await h.recoveryd.admin.post("/-/rotate-token", timeout=30)).status_code == 502
        assert (await h.recoveryd.admin.get("/metrics")).status_code == 200  # scrape gauges
        families = {
            exported_name(family): family
            for family in h.recoveryd.registry.collect()
            if family.name.startswith("recoveryd_")
        }
    table = metrics_table()
    assert sorted(families) == sorted(table)
    for name, family in families.items():
        kind, labels = table[name]
        assert kind == family.type, name
        for sample in family.samples:  # label names are known from samples only
            assert set(sample.labels) - {"le"} == labels, name


# A rules file with a rule of each action (one with a budget) and a sweep: every kind of
# series a rule or sweep brings.
EVERY_KIND = """\
version: 1
rules:
  - {name: restart-5xx, match: {responseStatus: {gte: 500}}, action: restart,
     budget: {maxRecoveries: 3, within: 1h}}
  - {name: resume-429, match: {responseStatus: 429}, action: resume}
  - {name: page, match: {responseStatus: 400}, action: notify,
     notify: {url: "https://hooks.example.com/x"}}
  - name: prune
    match: {responseStatus: 410}
    action: remove-endpoint
    threshold: {failures: 3, within: 10m}
  - {name: rest, match: {}, action: ignore}
sweeps:
  - {name: nightly, schedule: "0 3 * * *", action: resume, filter: {label: billing}}
"""
# Labels whose values are fixed in the code, so each table row lists them.
FIXED_LABELS = {"result", "reason", "source", "listener", "operation", "action", "state"}


def absent_at_start() -> set[str]:
    """The families docs/metrics.md says are absent until their first event or value."""
    page = text(DOCS / "metrics.md")
    [paragraph] = re.findall(r"^\*\*Absent at start\*\*.*?(?=\n\n)", page, re.M | re.S)
    return set(re.findall(r"`(recoveryd_[a-z_]+)`", paragraph))


async def scraped_at_start(tmp_path: Path) -> dict[str, Metric]:
    """The recoveryd_ families of a daemon just started on EVERY_KIND, by exported name,
    as its /metrics serves them."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(EVERY_KIND)
    async with running_recoveryd(tmp_path, RULES=str(rules)) as recoveryd:
        scraped = (await recoveryd.admin.get("/metrics")).text
    return {
        exported_name(family): family
        for family in text_string_to_metric_families(scraped)
        if family.name.startswith("recoveryd_")
    }


async def test_every_labelled_family_starts_with_its_known_series_at_zero(
    tmp_path: Path,
) -> None:
    """Just started, every labelled family of the table has its series, each counter and
    histogram at 0 (but the load at start), save those the docs say are absent at start."""
    families = await scraped_at_start(tmp_path)
    labelled = {name for name, (_, labels) in metrics_table().items() if labels}
    absent = {name for name in labelled if name not in families or not families[name].samples}
    assert absent == absent_at_start()
    for name in sorted(labelled - absent):
        for sample in families[name].samples:
            loaded = sample.labels == {"result": "success"} and "rules_reloads" in name
            if families[name].type in ("counter", "histogram") and not loaded:
                assert sample.value == 0, f"{name}{sample.labels} is {sample.value} at start"


async def test_every_fixed_label_value_exported_at_start_is_in_its_row(tmp_path: Path) -> None:
    """The values of a fixed label (a result, a reason, an operation...) that a daemon
    exports at start are the ones its row of the table lists (or a row it names)."""
    rows = {
        code_spans(row[0])[0]: set(code_spans(row[3]))
        for row in table_rows(text(DOCS / "metrics.md"))
        if row[0].startswith("`recoveryd_") and len(row) == 4
    }
    for name, family in (await scraped_at_start(tmp_path)).items():
        listed = rows[name].union(*(rows.get(other, set()) for other in rows[name]))
        for sample in family.samples:
            for label, value in sample.labels.items():
                if label in FIXED_LABELS:
                    assert value in listed, f"{name}: {label}={value!r} is not in its row"


def test_every_metric_the_docs_name_is_in_the_table() -> None:
    table = metrics_table()
    suffixes = ("_bucket", "_count", "_sum")
    cookies = {SESSION_COOKIE, CSRF_COOKIE}  # the console's (docs/console.md), not metrics
    named = set(re.findall(r"\brecoveryd_[a-z_]*[a-z]\b", every_page())) - cookies
    for name in sorted(named):
        base = next((name.removesuffix(s) for s in suffixes if name.endswith(s)), name)
        assert base in table or name in table, f"{name} is named in the docs but not exported"


# -- the command line -------------------------------------------------------------------


def test_every_command_and_option_is_documented() -> None:
    page = text(DOCS / "cli.md")
    assert isinstance(cli, click.Group)
    for name, command in cli.commands.items():
        part = section(page, f"## recoveryd {name}")
        for option in command.params:
            if isinstance(option, click.Option) and option.name != "help":
                longest = max(option.opts, key=len)
                assert longest in part, f"recoveryd {name} {longest} is not in docs/cli.md"


def test_every_command_the_docs_name_exists() -> None:
    pages = every_page()
    spans = re.findall(r"`recoveryd ([a-z][a-z-]*)", pages)
    blocks = "\n".join(re.findall(r"```(?:sh|text)\n(.*?)```", pages, re.DOTALL))
    lines = re.findall(r"^(?:\$ )?recoveryd ([a-z][a-z-]*)", blocks, re.MULTILINE)
    assert isinstance(cli, click.Group)
    for name in sorted(set(spans + lines)):
        assert name in cli.commands, f"recoveryd {name} is named in the docs but does not exist"


# -- HTTP routes ------------------------------------------------------------------------


def documented_routes(page: str) -> set[tuple[str, str]]:
    return set(re.findall(r"^### `(GET|POST|DELETE) (/[^`]*)`", page, re.MULTILINE))


async def test_every_route_is_documented_and_every_documented_route_answers(
    tmp_path: Path,
) -> None:
    documented = documented_routes(text(DOCS / "api.md"))
    async with harness(tmp_path, RESUME_ALL) as h:
        (dlq_id,) = await h.seed(workflows(1))
        await h.send_callbacks([dlq_id])
        admin_routes = {
            (method.upper(), path.replace("{dlq_id}", "{dlqId}"))
            for path, operations in h.recoveryd.daemon.admin.openapi()["paths"].items()
            for method in operations
        }
        assert admin_routes <= documented
        for method, path in sorted(documented):
            client = h.recoveryd.admin if (method, path) in admin_routes else h.recoveryd.public
            answer = await client.request(
                method, path.replace("{dlqId}", dlq_id), content=b"{}", timeout=30
            )
            # 400/401 are the route's own answers to an empty body; 404/405: no route,
            # unless the route said what it did not find (a removal of `{name}`).
            router_404 = answer.status_code == 404 and answer.text == '{"error":"Not Found"}'
            no_route = answer.status_code == 405 or router_404
            assert not no_route, (method, path, answer.text)


def test_every_emulator_control_route_is_documented() -> None:
    page = text(DOCS / "emulator.md")
    paths = create_app(emulator_config()).openapi()["paths"]
    control = {path for path in paths if path.startswith("/_emulator/")}
    assert control == set(re.findall(r"/_emulator/[a-z-]+", page))


# -- links and the README ---------------------------------------------------------------


def anchors(page: str) -> set[str]:
    """GitHub's anchor for each heading: lower case, punctuation dropped, spaces to `-`."""
    headings = re.findall(r"^#+ (.+)$", page, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    for target in re.findall(r"\]\(([^)\s]+)\)", text(page)):
        if re.match(r"[a-z]+:", target):
            continue  # an external URL
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: {target} does not exist"
        if anchor:
            assert anchor in anchors(text(linked)), f"{page.name}: no heading for {target}"


def test_the_readme_cites_no_document_users_do_not_have() -> None:
    readme = text(ROOT / "README.md")
    for cited in ("PRODUCT.md", "spec ", "service-api", "the product contract", "section "):
        assert cited not in readme


def test_ci_runs_the_readme_commands() -> None:
    """The README's first block is the two commands a newcomer runs; CI runs the test
    command verbatim and each command of the first hour from the clean clone."""
    readme = text(ROOT / "README.md")
    first_block = re.search(r"```sh\n(.*?)```", readme, re.DOTALL)
    assert first_block is not None
    install_and_demo, test_command = first_block.group(1).strip().splitlines()
    ci = text(ROOT / ".ci" / "run")
    assert test_command.split(" && ", 2)[2] in ci  # after the venv: install, lint, test
    assert install_and_demo.endswith("pip install -e . && recoveryd dev")
    for command in re.findall(r"^(recoveryd (?:dev|check|test|explain) [^#\n]*?)\s*(?:#|$)",
                              section(readme, "## A first hour"), re.MULTILINE):  # fmt: skip
        if not command.startswith("recoveryd dev"):
            assert command in ci, f"CI does not run {command!r}"
    assert "recoveryd dev --duration 10s" in ci


# How a sentence says a feature is missing: "no X yet", "not yet X", "without X yet".
ABSENT = (
    r"\bno ([\w .-]+?) yet\b",
    r"\bnot yet (?:an? |the )?([\w .-]+?)[,.;:)]",
    r"\bwithout ([\w .-]+?) yet\b",
)


def test_the_readme_status_names_nothing_missing_that_the_changelog_added() -> None:
    """The README's status says missing no feature that a CHANGELOG Added entry names."""
    status = re.search(r"^\*\*Status\.\*\*(.*?)\n\n", text(ROOT / "README.md"), re.M | re.S)
    assert status is not None
    said = " ".join(status[1].split())
    changelog = text(ROOT / "CHANGELOG.md")
    added = " ".join(re.findall(r"^### Added\n(.*?)(?=^##)", changelog, re.M | re.S)).lower()
    missing = [found for pattern in ABSENT for found in re.findall(pattern, said, re.I)]
    assert [found for found in missing if found.lower() in " ".join(added.split())] == []


def test_the_readme_layout_names_every_module_and_package() -> None:
    """Each module and package directly under daemon/ has its place in the README's Layout."""
    layout = section(text(ROOT / "README.md"), "## Layout")
    named = set(re.findall(r"`(daemon/[\w.]+)/?`", layout))
    here = {
        f"daemon/{path.name}"
        for path in (ROOT / "daemon").iterdir()
        if (path.suffix == ".py" and not path.name.startswith("__"))
        or (path / "__init__.py").exists()
    }
    assert sorted(here - named) == []


# -- ARCHITECTURE.md and what the code cites ---------------------------------------------


def test_the_architecture_names_every_package_and_top_level_module() -> None:
    """ARCHITECTURE.md names each package in daemon/ as `daemon/x/` and each top-level
    module as `daemon/x.py`."""
    architecture = text(ROOT / "ARCHITECTURE.md")
    daemon = ROOT / "daemon"
    packages = {
        f"`daemon/{init.parent.relative_to(daemon).as_posix()}/`"
        for init in daemon.rglob("__init__.py")
        if init.parent != daemon
    }
    modules = {
        f"`daemon/{module.name}`" for module in daemon.glob("*.py") if module.name != "__init__.py"
    }
    assert sorted(name for name in packages | modules if name not in architecture) == []


def cited_outside(path: Path) -> list[str]:
    """The lines of `path` that cite the design notes kept outside the repository."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return [
        f"{path.relative_to(ROOT).as_posix()}:{number}: {line.strip()}"
        for number, line in enumerate(lines, 1)
        if "PRODUCT.md" in line or "shared/" in line
    ]


def test_nothing_cites_documents_outside_the_repository() -> None:
    """daemon/, docs/ and the README cite docs/ or ARCHITECTURE.md, never PRODUCT.md or
    shared/, which users and contributors do not have."""
    files = [ROOT / "README.md"] + [
        path
        for folder in (ROOT / "daemon", DOCS)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    ]
    cited = [line for path in files for line in cited_outside(path)]
    assert cited == []


def test_every_page_the_code_cites_exists_with_its_heading() -> None:
    """A `docs/page.md#heading` or `ARCHITECTURE.md#heading` in daemon/ resolves."""
    pattern = r"\b((?:docs/[\w-]+\.md|ARCHITECTURE\.md)(?:#[\w-]+)?)"
    for module in sorted((ROOT / "daemon").rglob("*.py")):
        for cited in re.findall(pattern, text(module)):
            path, _, anchor = cited.partition("#")
            page = ROOT / path
            assert page.exists(), f"{module.relative_to(ROOT)}: {cited} does not exist"
            if anchor:
                assert anchor in anchors(text(page)), f"{module.relative_to(ROOT)}: {cited}"
