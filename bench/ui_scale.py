"""Benchmark: the UI's first pages at a real company's size, in Chromium.

It writes ``bench/automation_scale.py``'s synthetic catalog of N tables (same generator, same seed), each table with
a ``domain`` (its ODS root's: ``groups`` of ``<layer>_<domain>``; ``--no-domains``: one group per layer), fills the
lineage cache for it (as a code location that loaded once before), and serves it as a user meets it:
``dagster-webserver`` on a temporary ``DAGSTER_HOME`` (SQLite, no daemon) with ``workspace.yaml``'s code location on
that catalog (``WAREHOUSE_CATALOG_DIR``), which the webserver starts in a code server of its own. Then:

* **load_s**: webserver started → its code location loaded (GraphQL ``workspaceOrError`` says ``LOADED``);
  ``code_server_mb`` and ``webserver_mb``: their RSS once loaded, and again after the pages (``*_after_mb``);
* **pages**: a headless Chromium opens, each from a fresh tab, the asset graph of one group (``group_s``: an asset
  node of the group drawn), one derived table's page (``asset_s``: its ``column_lineage`` Markdown shown), the runs
  list (``runs_s``: the list or its empty state drawn) and the global asset graph (``global_s``: the node of a group
  drawn), then the group's graph again (``again_s``: the first page fetched every asset's definition, which the UI
  keeps). A page not drawn within ``--page-timeout`` seconds counts as given up: its figure is ``nan`` and
  ``rendered`` says how many of the five were drawn;
* **graphql**: what each page asked the webserver, from Chromium's network log: its GraphQL operations' total bytes
  (``*_kb``, as sent on the wire) and the slowest one (``*_gql_s``); over all pages, the two queries behind the
  graphs: ``workspace_assets_kb``/``_s`` (every asset's definition, the UI's workspace cache, fetched by the first
  page) and ``asset_live_kb``/``_s`` (the live state of the assets a graph draws);
* **groups**: ``groups`` and ``largest_group`` (the assets of the largest one, the group whose page is opened);
* **shares**: ``description_share``, the descriptions' part of every asset's definition as the UI fetches it (Dagster
  cuts each at 240 characters there), and ``lineage_share``, the column lineage Markdown's part of the asset page's
  definition query (the graphs' queries carry no metadata).

The figures of a shared or loaded machine are not benchmarks: run it alone. The ``RESULT`` line carries the machine's
``calib_ms`` (``bench/calibration.py``).

    .venv/bin/python bench/ui_scale.py               # N = 10,000
    .venv/bin/python bench/ui_scale.py --quick       # N = 300: about a minute
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from automation_scale import generate_catalog

from bench.calibration import calib_ms
from bench.processes import free_port, kill_stragglers

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
INSTANCE = "storage:\n  sqlite:\n    base_dir: {home}\ntelemetry:\n  enabled: false\n"
LOCATION = "warehouse"  # workspace.yaml's code location
WORKSPACE = """query {
  workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
    locationOrLoadError { __typename ... on PythonError { message } } } } }
}"""
PAGES = ("group", "asset", "runs", "global", "again")
# the queries behind the graphs: every asset's definition (the UI fetches the whole workspace's once, then keeps it in
# the browser's IndexedDB) and their live state (statuses, partitions, checks), in batches of the assets drawn
WATCHED = {"LocationWorkspaceAssetsQuery": "workspace_assets", "AssetGraphLiveQuery": "asset_live"}


def graphql(url: str, query: str, timeout: float = 60) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}/graphql", data=json.dumps({"query": query}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return dict(json.loads(response.read()))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def code_server_pid(marker: str, webserver: int) -> int | None:
    """The code server the webserver started: the other process carrying the bench's DAGSTER_HOME."""
    needle = marker.encode() + b"\0"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == webserver:
            continue
        try:
            if needle in (entry / "environ").read_bytes() and b"grpc" in (entry / "cmdline").read_bytes():
                return int(entry.name)
        except OSError:
            continue
    return None


@contextmanager
def served(work: Path, tables: Path, timeout: float) -> Iterator[tuple[str, float, int, int]]:
    """The webserver on ``tables``' catalog: (its URL, seconds until the code location loaded, webserver PID, code
    server PID). Everything it started is killed on the way out."""
    home = work / "dagster_home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text(INSTANCE.format(home=home))
    env = dict(
        os.environ,
        DAGSTER_HOME=str(home),
        WAREHOUSE_CATALOG_DIR=str(tables),
        WAREHOUSE_LAKE_ROOT=str(work / "lake"),
        WAREHOUSE_LANDING_ROOT=str(work / "landing"),
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (work / "webserver.log").open("wb")
    command = [str(Path(sys.executable).parent / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(port)]
    started = time.monotonic()
    proc = subprocess.Popen(
        [*command, "-w", "workspace.yaml"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        load_s = wait_loaded(url, proc, started, timeout, work / "webserver.log")
        server = code_server_pid(f"DAGSTER_HOME={home}", proc.pid)
        yield url, load_s, proc.pid, server or proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        kill_stragglers(f"DAGSTER_HOME={home}")
        log.close()


def wait_loaded(url: str, proc: subprocess.Popen[bytes], started: float, timeout: float, log: Path) -> float:
    """Seconds from ``started`` until the code location is loaded; a clear error when it failed or never did."""
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"the webserver exited ({proc.returncode}): {log.read_text()[-3000:]}")
        try:
            entries = graphql(url, WORKSPACE, timeout=30)["data"]["workspaceOrError"]["locationEntries"]
        except OSError:
            time.sleep(0.5)
            continue
        entry = next((e for e in entries if e["name"] == LOCATION), None)
        if entry is not None and entry["loadStatus"] == "LOADED":
            loaded = entry["locationOrLoadError"]
            if loaded["__typename"] == "PythonError":
                raise SystemExit(f"the code location failed to load: {loaded['message']}")
            return time.monotonic() - started
        time.sleep(0.5)
    raise SystemExit(f"the code location did not load within {timeout:.0f} s; the webserver's log: {log}")


def require_browser() -> None:
    """Stop at once when Chromium or its driver is missing, before the catalog is written and the stack started."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        raise SystemExit(f"not installed: {', '.join(missing)} (`make system-packages` installs them as root)")


def browser() -> Any:
    """Headless Chromium with its network log kept (the GraphQL operations' sizes and times)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    require_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    # no sandbox: CI runs as root, where Chromium's sandbox refuses to start
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1300"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)


def operations(log: list[dict[str, Any]]) -> dict[str, tuple[float, float, str]]:
    """(bytes on the wire, seconds from request to its last byte, the last one's request id) of each GraphQL operation
    in Chromium's network log, by operation name (the UI names each: ``/graphql?op=AssetGraphLiveQuery``); repeats
    are summed / maxed."""
    sent: dict[str, tuple[str, float]] = {}
    done: dict[str, tuple[float, float, str]] = {}
    for entry in log:
        message = json.loads(entry["message"])["message"]
        params = message.get("params", {})
        if message["method"] == "Network.requestWillBeSent" and "/graphql" in params["request"]["url"]:
            op = params["request"]["url"].partition("op=")[2] or json.loads(
                params["request"].get("postData") or "{}"
            ).get("operationName", "?")
            sent[params["requestId"]] = (op, params["timestamp"])
        elif message["method"] == "Network.loadingFinished" and params["requestId"] in sent:
            op, at = sent.pop(params["requestId"])
            size, took, _ = done.get(op, (0.0, 0.0, ""))
            done[op] = (size + params["encodedDataLength"], max(took, params["timestamp"] - at), params["requestId"])
    return done


def open_page(
    driver: Any, url: str, drawn: Callable[[Any], bool], timeout: float
) -> tuple[float, dict[str, tuple[float, float, str]]]:
    """Seconds until ``drawn`` holds on ``url`` opened in a fresh tab (nan: given up), and its GraphQL operations."""
    from selenium.common.exceptions import TimeoutException, WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    driver.switch_to.new_window("tab")
    driver.get_log("performance")  # what earlier pages left
    started = time.monotonic()
    driver.get(url)

    def holds(d: Any) -> bool:
        try:
            return drawn(d)
        except WebDriverException:  # the page re-rendered under us
            return False

    try:
        WebDriverWait(driver, timeout, poll_frequency=0.2).until(holds)
        took = time.monotonic() - started
    except TimeoutException:
        took = math.nan
    time.sleep(0.5)  # the queries the drawn page still had in flight
    return took, operations(driver.get_log("performance"))


def share(driver: Any, request_id: str, part: Callable[[dict[str, Any]], int]) -> float:
    """The share of a GraphQL response's JSON (as Chromium received it) taken by what ``part`` counts in each object
    (characters; 0: look inside it)."""
    from selenium.common.exceptions import WebDriverException

    body = None
    # a response still arriving has no body yet, and one another tab's polling made is not this tab's (Chromium: "No
    # resource with given identifier found")
    for _ in range(20):
        try:
            body = driver.execute_cdp_cmd("Network.getResponseBody", {"requestId": request_id})["body"]
            break
        except WebDriverException:
            time.sleep(0.5)
    if body is None:
        return math.nan  # printed as nan: the share could not be read, the pages' figures stand
    taken = 0

    def walk(value: Any) -> None:
        nonlocal taken
        if isinstance(value, dict):
            counted = part(value)
            if counted:
                taken += counted
                return
            value = list(value.values())
        if isinstance(value, list):
            for item in value:
                walk(item)

    walk(json.loads(body))
    return taken / len(body)


def lineage_entry(value: dict[str, Any]) -> int:
    """A metadata entry of the table's column lineage Markdown, whole."""
    return len(json.dumps(value)) if str(value.get("label", "")).startswith("column_lineage") else 0


def description(value: dict[str, Any]) -> int:
    """An asset's description, its field and value."""
    return len(json.dumps({"description": value["description"]})) if value.get("description") else 0


def titled(names: list[str]) -> Callable[[Any], bool]:
    """A node of ``names`` is drawn: the asset graph names each node it draws (only those in view) in its title or
    tooltip attribute, a group's node by its title."""
    wanted = set(names)
    script = (
        "return Array.from(document.querySelectorAll('[title], [data-tooltip]'), "
        "e => e.getAttribute('title') || e.getAttribute('data-tooltip'))"
    )
    return lambda d: bool(wanted.intersection(d.execute_script(script)))


def showing(text: str) -> Callable[[Any], bool]:
    from selenium.webdriver.common.by import By

    return lambda d: text in d.find_element(By.TAG_NAME, "body").text


def groups_of(catalog: Any) -> dict[str, list[str]]:
    """The names of each group's assets: every table's group, as the compiler gives it."""
    groups: dict[str, list[str]] = {}
    for table in sorted(catalog.tables.values(), key=lambda t: t.fqn):
        groups.setdefault(table.group, []).append(table.name)
    return groups


def measure(n: int, seed: int, page_timeout: float, load_timeout: float, domains: bool) -> dict[str, Any]:
    from warehouse_assets.catalog import load_catalog
    from warehouse_assets.catalog.lineage_cache import lineage_at_load

    with tempfile.TemporaryDirectory(prefix=f"ui_scale_{n}_") as tmp:
        work = Path(tmp)
        tables = work / "tables"
        generate_catalog(tables, n, seed, domains=domains)
        catalog = load_catalog(tables)
        groups = groups_of(catalog)
        # the lineage cache filled, as by an earlier load: the product's load reads it from DAGSTER_HOME
        lineage_at_load(catalog, str(work / "dagster_home"))
        derived = sorted((t for t in catalog.derived() if t.kind != "static"), key=lambda t: t.fqn)
        table = derived[len(derived) // 2]
        group = max(groups, key=lambda g: len(groups[g]))
        r: dict[str, Any] = {
            "n": n,
            "domains": "yes" if domains else "no",
            "groups": len(groups),
            "largest_group": len(groups[group]),
        }
        with served(work, tables, load_timeout) as (url, load_s, web, server):
            r.update(load_s=load_s, code_server_mb=rss_mb(server), webserver_mb=rss_mb(web))
            driver = browser()
            try:
                driver.get(f"{url}/health")
                driver.execute_script("localStorage.setItem('communityNux', JSON.stringify('1'))")
                layer, name = table.key
                pages = {
                    "group": (f"/locations/{LOCATION}/asset-groups/{quote(group)}/lineage", titled(groups[group])),
                    "asset": (f"/assets/{layer}/{name}", showing("column_lineage")),
                    "runs": ("/runs", lambda d: showing("No runs")(d) or showing("Run ID")(d)),
                    "global": ("/asset-groups", titled(list(groups))),  # a group's node
                }
                pages["again"] = pages["group"]  # the group's graph once the UI keeps every definition
                for page, (path, drawn) in pages.items():
                    took, ops = open_page(driver, url + path, drawn, page_timeout)
                    r[f"{page}_s"] = took
                    r[f"{page}_kb"] = sum(size for size, _, _ in ops.values()) / 1024
                    r[f"{page}_gql_s"] = max((t for _, t, _ in ops.values()), default=0.0)
                    if "LocationWorkspaceAssetsQuery" in ops:  # the descriptions' part of every asset's definition
                        request = ops["LocationWorkspaceAssetsQuery"][2]
                        found = share(driver, request, description)
                        if not math.isnan(found) or "description_share" not in r:
                            r["description_share"] = found
                    if page == "asset" and "AssetViewDefinitionQuery" in ops:
                        r["lineage_share"] = share(driver, ops["AssetViewDefinitionQuery"][2], lineage_entry)
                    for op, (size, t, _) in ops.items():
                        if op in WATCHED:
                            key = WATCHED[op]
                            r[f"{key}_kb"] = r.get(f"{key}_kb", 0.0) + size / 1024
                            r[f"{key}_s"] = max(r.get(f"{key}_s", 0.0), t)
                    r[f"{page}_ops"] = ",".join(sorted(ops))
            finally:
                driver.quit()
            r.update(code_server_after_mb=rss_mb(server), webserver_after_mb=rss_mb(web))
    r["rendered"] = sum(not math.isnan(r[f"{p}_s"]) for p in PAGES)
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000, help="catalog size (default 10000)")
    parser.add_argument("--quick", action="store_true", help="N = 300")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--page-timeout", type=float, default=120.0, help="seconds before a page counts as given up")
    parser.add_argument("--load-timeout", type=float, default=900.0)
    parser.add_argument(
        "--no-domains", action="store_true", help="no table declares a domain: one group per layer, as before"
    )
    args = parser.parse_args()
    n = 300 if args.quick else args.n
    require_browser()
    calib = calib_ms()
    r = measure(n, args.seed, args.page_timeout, args.load_timeout, domains=not args.no_domains)
    print(f"N={n}: {r['groups']} groups, the largest {r['largest_group']} assets")
    print(f"code location loaded by the webserver in {r['load_s']:.1f} s; RSS code server {r['code_server_mb']:.0f} MB")
    print(f"  (after the pages {r['code_server_after_mb']:.0f}), webserver {r['webserver_mb']:.0f} MB")
    print(f"{'page':>8} {'drawn s':>8} {'graphql kB':>11} {'slowest query s':>16}  operations")
    for page in PAGES:
        print(
            f"{page:>8} {r[f'{page}_s']:>8.2f} {r[f'{page}_kb']:>11.1f} {r[f'{page}_gql_s']:>16.2f}  {r[f'{page}_ops']}"
        )
    keys = [
        "n",
        "domains",
        "groups",
        "largest_group",
        "load_s",
        "code_server_mb",
        "webserver_mb",
        "code_server_after_mb",
    ]
    keys += ["webserver_after_mb", *(f"{p}_{k}" for p in PAGES for k in ("s", "kb", "gql_s"))]
    keys += [f"{w}_{k}" for w in WATCHED.values() for k in ("kb", "s")]
    keys += ["description_share", "lineage_share", "rendered"]
    figures = [
        f"{k}={r.get(k, math.nan):.3f}" if isinstance(r.get(k, math.nan), float) else f"{k}={r[k]}" for k in keys
    ]
    print("RESULT " + " ".join(figures) + f" calib_ms={calib}")


if __name__ == "__main__":
    main()
