"""The MLflow UI on the project's store, checked in a real headless Chromium: the experiment, its runs and a
metric chart are shown. Screenshots go to results/mlflow_ui/ (view them)."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO, free_port

from calibrl.tracking import RunRecord, Store

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (apt-get install -y chromium; CI installs it)"
    ),
]


@contextlib.contextmanager
def mlflow_server(store_uri: str | None = None, results: Path | None = None):
    """A real ``mlflow server`` on ``store_uri`` (or ``calibrl ui`` on a ``results`` folder, as the README opens it)
    on a free loopback port, once it answers /health (on a loaded 2-core machine that can take minutes: polled
    until then, never a fixed wait)."""
    port = free_port()
    if results is not None:
        cmd = [sys.executable, "-m", "calibrl.cli", "ui", "--results", str(results), "--port", str(port)]
    else:
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store_uri,
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]  # fmt: skip
    err = tempfile.TemporaryFile(mode="w+")  # not a pipe: a server that logs every request would fill it and stall
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    err.seek(0)
                    raise AssertionError(f"mlflow server exited: {err.read()[-3000:]}") from None
                time.sleep(0.5)
        else:
            raise AssertionError("mlflow server did not answer /health in 5 minutes")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its workers
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        err.close()


@pytest.fixture
def ui(tmp_path):
    store = Store(tmp_path / "mlflow")
    for method, alpha in (("grpo", 0.0), ("iac", 1.0)):
        store.upsert(
            "calibrl-ui-test",
            RunRecord(
                key=f"grid/tiny/{method}/s0",
                name=f"tiny/{method}/s0",
                params={"method": method, "iac_alpha": alpha},
                tags={"model": "tiny", "method": method, "alpha": alpha},
                metrics=[("eval/test/avg_at_8", 0.2 + 0.01 * s + alpha / 10, s) for s in range(0, 100, 10)],
            ),
        )
    with mlflow_server(store.uri) as url:
        yield url, store


def test_experiment_runs_and_metric_chart_in_chromium(ui, tmp_path):
    from playwright.sync_api import sync_playwright

    url, store = ui
    exp_id = store.client.get_experiment_by_name("calibrl-ui-test").experiment_id
    run_id = store.client.search_runs([exp_id], filter_string="tags.method = 'iac'")[0].info.run_id
    shots = REPO / "results" / "mlflow_ui"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            args=FLAGS,
            headless=True,
            viewport={"width": 1400, "height": 900},
        )
        page = browser.new_page()
        page.goto(f"{url}/#/experiments/{exp_id}/runs", timeout=60_000)
        page.get_by_text("calibrl-ui-test").first.wait_for(timeout=60_000)
        page.get_by_text("tiny/iac/s0").first.wait_for(timeout=60_000)
        assert page.get_by_text("tiny/grpo/s0").count() >= 1
        page.screenshot(path=str(shots / "experiment.png"))
        metric = "eval/test/avg_at_8"
        # The run's metric charts (MLflow 3: "Model metrics" tab), one chart per metric key.
        page.goto(f"{url}/#/experiments/{exp_id}/runs/{run_id}/model-metrics", timeout=60_000)
        page.get_by_text(metric).first.wait_for(timeout=60_000)
        page.locator(".js-plotly-plot, canvas, svg.main-svg").first.wait_for(timeout=60_000)
        page.wait_for_timeout(1500)  # let the chart finish drawing before the screenshot
        page.screenshot(path=str(shots / "metric_chart.png"))
        browser.close()
    assert (shots / "experiment.png").stat().st_size > 10_000
    assert (shots / "metric_chart.png").stat().st_size > 10_000


@pytest.fixture
def grid_ui(tmp_path):
    """The grid's MLflow view as the workflow builds it (calibrl.report: aggregation, then the MLflow sync) from
    result files of three runs, served by a real ``mlflow server``."""
    from conftest import fake_run_results, filled

    from calibrl import grid as G
    from calibrl.report.jobs import aggregate_job
    from calibrl.report.mlflow_view import sync_grid_mlflow

    grid = filled("config")["grid"]
    grid["models"] = {"qwen3-tiny-m": grid["models"]["qwen3-tiny-m"]}
    grid["seed"] = 0  # the fake runs' main seed
    grid["tables"] = {"table2_3": ["grpo", "iac"], "table4": [], "table5": ["grpo", "iac"], "figure6": []}
    # rule grid_mlflow's params: the methods compiled (calibrl.spec.MethodSpec.to_dict)
    grid["methods"] = {m: G.method({"grid": grid}, m).to_dict() for m in ("grpo", "iac")}
    res = tmp_path / "results"
    runs = [("qwen3-tiny-m", "grpo", 0), ("qwen3-tiny-m", "iac", 0), ("qwen3-tiny-m", "grpo", 1)]
    evals, metrics = fake_run_results(res, runs, k=8, splits=("test", "ood"))
    aggregate_job(grid, evals, metrics, str(res), str(res / "aggregate.json"))
    sync_grid_mlflow(grid, evals, metrics, str(res), str(res / "mlflow"), "calibrl-ui", str(res / "grid_mlflow.json"))
    moved = tmp_path / "copied" / "results"  # a results folder moved (or copied to a laptop) after the run
    shutil.move(res, moved)
    with mlflow_server(results=moved) as url:
        yield url, json.loads((moved / "grid_mlflow.json").read_text())


def test_what_a_user_sees_first_is_the_training_runs_and_the_claims(grid_ui, tmp_path):
    """The links the workflow writes open the model-training view (runs table), not MLflow 3's GenAI traces
    view; the grid's experiment holds only training runs, named by method and seed; the claims' experiment
    lists each claim with its verdict."""
    from playwright.sync_api import sync_playwright

    url, written = grid_ui
    shots = REPO / "results" / "mlflow_ui"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, args=FLAGS, headless=True,
            viewport={"width": 1400, "height": 900},
        )  # fmt: skip
        page = browser.new_page()
        page.goto(url + written["open"]["grid"], timeout=60_000)
        page.get_by_text("grpo s1 (qwen3-tiny-m)").first.wait_for(timeout=60_000)
        page.wait_for_timeout(1000)
        page.screenshot(path=str(shots / "grid_first_view.png"))
        text = page.inner_text("body")
        assert "iac s0 (qwen3-tiny-m)" in text and "grpo s0 (qwen3-tiny-m)" in text
        assert "tables and figures" not in text  # no pseudo-run among the training runs
        assert "No traces" not in text and "Traces" not in text.split("Runs")[0]  # the runs view, not GenAI's
        page.goto(url + written["open"]["claims"], timeout=60_000)
        page.get_by_text("inconclusive: IAC above grpo", exact=False).first.wait_for(timeout=60_000)
        page.screenshot(path=str(shots / "claims_first_view.png"))
        # the results folder was moved before the UI opened (calibrl ui): its artifacts are found at the new place
        claims_exp = written["open"]["claims"].split("/experiments/")[1].split("?")[0]
        run = written["runs"]["tables"]
        page.goto(f"{url}/#/experiments/{claims_exp}/runs/{run}/artifacts/tables/table2.md?workflowType=machine_learning",
                  timeout=60_000)  # fmt: skip
        page.get_by_text("Table 2: AVG@8", exact=False).first.wait_for(timeout=60_000)
        page.screenshot(path=str(shots / "moved_store_artifact.png"))
        assert "copied/results/mlflow/artifacts/" in page.inner_text("body")  # the file's place, as the UI shows it
        browser.close()
