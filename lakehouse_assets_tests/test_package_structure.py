"""The package's shape: no import cycle, one handle instead of configuration and paths side by
side, a code location that does no work when imported, DuckDB checks that run without PySpark, and
the suite's list of its longest files."""

import ast
import subprocess
import sys
from pathlib import Path

from lakehouse_assets_tests.conftest import LONGEST_FILES, TESTS_ROOT

PACKAGE = Path(__file__).resolve().parents[1] / "lakehouse_assets"


def _imports(path: Path) -> set[str]:
    """The package modules ``path`` imports anywhere in it (functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lakehouse_assets"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("lakehouse_assets"))
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_imports_itself_through_others():
    graph = {_module_name(path): _imports(path) for path in PACKAGE.rglob("*.py")}
    graph = {module: {dep for dep in deps if dep in graph and dep != module} for module, deps in graph.items()}
    cycles, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                cycles.append(" -> ".join([*path[path.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*path, dep])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


LAYERS = [
    ["errors", "faults", "paths", "locks", "storage_space", "config.env_references"],
    ["jvm"],
    ["catalog.catalogs", "catalog.iceberg_types"],
    ["config"],
    ["catalog"],
    ["batches"],
    ["lakehouse"],
    ["engine"],
    ["source"],
    ["commit"],
    ["ingest"],
    ["quality"],
    ["runtime"],
    ["ops", "http_source"],
    ["defs"],
    ["definitions", "runner"],
    ["cli"],
]
"""The package's layers, lowest first, by module prefix (the longest prefix names a module's
layer): a module imports from its own layer and those below, never from one above."""


def _layer(module: str) -> int:
    name = module.removeprefix("lakehouse_assets.")
    matches = [
        (len(prefix), index)
        for index, prefixes in enumerate(LAYERS)
        for prefix in prefixes
        if name == prefix or name.startswith(prefix + ".")
    ]
    assert matches, f"{module} is in no layer of LAYERS"
    return max(matches)[1]


def test_every_import_points_down_the_layers():
    modules = {
        _module_name(path): path for path in PACKAGE.rglob("*.py") if path.parent != PACKAGE or path.stem != "__init__"
    }
    upward = []
    for module, path in sorted(modules.items()):
        for imported in sorted(_imports(path) & set(modules)):
            if _layer(imported) > _layer(module):
                upward.append(f"{module} -> {imported}")
    assert len(modules) > 100 and upward == []


ENGINE_PACKAGES = ["batches", "config", "ingest", "commit", "quality", "catalog", "engine", "jvm", "source"]
ENGINE_MODULES = ["lakehouse.py", "paths.py", "errors.py", "faults.py", "locks.py", "ops/maintenance.py"]
ENGINE_MODULES += ["ops/replay.py"]


def _all_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_engine_imports_no_dagster():
    engine = [path for package in ENGINE_PACKAGES for path in (PACKAGE / package).rglob("*.py")]
    engine += [PACKAGE / module for module in ENGINE_MODULES]
    importing = [_module_name(path) for path in engine if any(m.split(".")[0] == "dagster" for m in _all_imports(path))]
    assert len(engine) > 60 and importing == []


def test_commit_imports_nothing_from_ingest():
    # ``batches`` is their contract; ``table_commits`` gives the committer ingest's staging.
    importing = {
        _module_name(path): sorted(m for m in _imports(path) if m.startswith("lakehouse_assets.ingest"))
        for path in (PACKAGE / "commit").rglob("*.py")
    }
    assert {module: found for module, found in importing.items() if found} == {}


def test_no_function_takes_the_configuration_and_the_paths_instead_of_the_handle():
    both = []
    project = PACKAGE.parent
    for path in [
        *PACKAGE.rglob("*.py"),
        *(project / "bench").glob("*.py"),
        *(project / "lakehouse_assets_tests").rglob("*.py"),
    ]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                parameters = {a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs}
                if {"config", "paths"} <= parameters:
                    both.append(f"{_module_name(path)}.{node.name}")
    assert both == []


def _python(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {"LAKEHOUSE_HOME": str(tmp_path / "home"), "LAKEHOUSE_CONFIG": str(tmp_path / "missing.yaml")}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)


def test_importing_the_code_location_reads_no_file(tmp_path):
    # The configuration does not exist: building the definitions would fail, importing must not.
    completed = _python(
        "import sys\n"
        "opened = []\n"
        "sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == 'open' else None)\n"
        "import lakehouse_assets.definitions\n"
        f"print([path for path in opened if path.startswith({str(tmp_path)!r}) or path.endswith('.yaml')])\n",
        tmp_path,
    )

    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"


def _modules_loaded_by(module: str, prefixes: tuple[str, ...], tmp_path: Path) -> list[str]:
    """The modules named by ``prefixes`` (a package and its submodules) that importing ``module``
    loads, in a fresh interpreter."""
    completed = _python(
        f"import sys\nimport {module}\n"
        f"print([m for m in sorted(sys.modules) if any(m == p or m.startswith(p + '.') for p in {prefixes!r})])\n",
        tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    return ast.literal_eval(completed.stdout.strip())


def test_the_duckdb_checks_import_no_pyspark(tmp_path):
    assert _modules_loaded_by("lakehouse_assets.quality.checks", ("pyspark", "py4j"), tmp_path) == []


def test_the_lakehouse_command_imports_dagster_only_after_starting_spark(tmp_path):
    # ``lakehouse run --until-idle`` starts its JVM before Dagster's import, to overlap them.
    loaded = _modules_loaded_by("lakehouse_assets.cli.main", ("dagster", "lakehouse_assets.cli.commands"), tmp_path)
    assert loaded == []


def test_every_file_the_suite_starts_first_exists():
    """A renamed long file would lose its place at the start of the run without a word."""
    assert [name for name in LONGEST_FILES if not (TESTS_ROOT / name).is_file()] == []
