"""The committed notebooks follow notebooks/README.md: stripped, one literal parameters cell with
comments, exactly the fields of the Config their metadata names (plus preset and out_dir), a setup
call that passes every one of them, no logic of their own, a computed conclusion last."""

import ast

import nbformat
import pytest

from gdn_lab.report.parameters import config_class, field_names, read_schema
from gdn_lab.report.runner import discover
from gdn_lab.report.strip import is_stripped, main, strip

NOTEBOOKS = discover()
REQUIRED = ("preset", "device", "seed", "out_dir")


@pytest.fixture(params=list(NOTEBOOKS), ids=list(NOTEBOOKS))
def nb(request):
    return nbformat.read(str(NOTEBOOKS[request.param]), as_version=4)


def test_suite_has_the_core_notebooks():
    for name in ("00_environment_and_routing", "01_batch_invariance", "02_partition_edges",
                 "03_kv_cache_fp8_vs_bf16", "04_fused_prefill_parity"):  # fmt: skip
        assert name in NOTEBOOKS


def test_committed_without_outputs(nb):
    assert is_stripped(nb)


def test_one_parameters_cell_of_commented_literals(nb):
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and tagged[0].cell_type == "code"
    names = []
    for line in tagged[0].source.splitlines():
        if not line.strip():
            continue
        code, sep, comment = line.partition("  # ")
        assert sep and comment.strip(), f"no trailing '# what it means' comment: {line!r}"
        stmt = ast.parse(code).body
        assert len(stmt) == 1 and isinstance(stmt[0], ast.Assign) and len(stmt[0].targets) == 1, line
        ast.literal_eval(stmt[0].value)  # literals only
        names.append(stmt[0].targets[0].id)
    assert set(REQUIRED) <= set(names) and len(names) == len(set(names))


def test_parameters_are_the_fields_of_the_config_the_metadata_names(nb, request):
    name = nb.metadata["gdn_lab"]["config"]
    cls = config_class(name)
    tagged = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    names = [ast.parse(line.partition("  # ")[0]).body[0].targets[0].id for line in tagged.source.splitlines() if line]
    assert names[:2] == ["preset", "out_dir"] and sorted(names[2:]) == sorted(field_names(cls))
    # the setup cell: setup(<that class>, "<stem>", preset=preset, out_dir=out_dir, <field>=<field>, ...)
    calls = [
        n for c in nb.cells if c.cell_type == "code" for n in ast.walk(ast.parse(c.source))
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "setup"
    ]  # fmt: skip
    assert len(calls) == 1
    call = calls[0]
    assert call.args[0].id == cls.__name__ and ast.literal_eval(call.args[1]) == request.node.callspec.params["nb"]
    assert {k.arg: k.value.id for k in call.keywords} == {n: n for n in names}


def test_every_notebook_reads_as_a_schema():
    for name, path in NOTEBOOKS.items():
        schema = read_schema(path)
        assert schema.notebook == name and set(schema.cell) == {"preset", "out_dir", *field_names(schema.config)}


def test_no_logic_in_the_notebook_and_a_computed_conclusion(nb):
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    for src in code:
        tree = ast.parse("\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!"))))
        assert not any(isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Lambda)) for n in ast.walk(tree)), src
    assert "Markdown(" in code[-1], "the last cell shows a conclusion built by gdn_lab"
    assert "write_headline(" in "\n".join(code), "the notebook writes its headline for the index"


def test_strip_removes_outputs(tmp_path):
    path = tmp_path / "x.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1", execution_count=3)])
    nb.cells[0].outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "1"}, execution_count=3)]
    nb.metadata["papermill"] = {"parameters": {}}
    nbformat.write(nb, str(path))
    assert main(["--check", str(path)]) == 1
    assert main([str(path)]) == 0 and main(["--check", str(path)]) == 0
    assert is_stripped(nbformat.read(str(path), as_version=4)) and is_stripped(strip(nb))
