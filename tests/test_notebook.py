"""notebooks/sweep_analysis.ipynb runs from a clean checkout: executed with nbclient (the standard Jupyter
execution library) with the notebook's own folder as the working directory, it raises no error and draws its
figure. The committed notebook stays without outputs; the run works on a copy in tmp_path and sends the
sweep's results there (CHIPSIM_NOTEBOOK_OUT), so the checkout is left untouched."""

import os
import shutil

import pandas as pd
import pytest
from conftest import ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = os.path.join(ROOT, "notebooks", "sweep_analysis.ipynb")


def test_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code
    for cell in code:
        assert cell.outputs == [] and cell.execution_count is None, "strip the notebook's outputs before committing"


def test_notebook_executes_and_draws_its_figure(tmp_path, monkeypatch):
    copy = tmp_path / "sweep_analysis.ipynb"
    shutil.copyfile(NOTEBOOK, copy)
    out = tmp_path / "out"
    monkeypatch.setenv("CHIPSIM_NOTEBOOK_OUT", str(out))  # the kernel inherits the environment
    nb = nbformat.read(copy, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}})
    client.execute()  # raises CellExecutionError on the first failing cell
    nbformat.write(nb, copy)  # the executed copy, for a look after a failure

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, [f"{o.ename}: {o.evalue}" for o in errors]
    assert all(cell.execution_count for cell in nb.cells if cell.cell_type == "code")
    pngs = [o.data["image/png"] for o in outputs if o.output_type in ("display_data", "execute_result")
            and "image/png" in o.get("data", {})]
    assert len(pngs) == 1 and pngs[0].startswith("iVBORw0KGgo")  # base64 of the PNG signature

    df = pd.read_csv(out / "results.csv")
    assert len(df) == 6 * 3 and set(df["policy"]) == {"no-prefetch", "apex", "oracle"}
    assert (out / "latency_vs_pcie.png").stat().st_size > 10_000
    assert (out / "latency_vs_pcie.pdf").is_file()
