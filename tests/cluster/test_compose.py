"""docker-compose.yml describes a topology that would really run: there is no Docker engine
here, so instead of starting it, every command is checked against the program it names
(tidemark's CLI, Spark's master/worker argument parsers in the pyspark jars), every bound
file exists, and the pieces point at each other (Prometheus -> control and index, control ->
index with its token, drivers -> Spark master, executors -> shared checkpoints)."""

from __future__ import annotations

import glob
import os
import re
import shlex
import zipfile
from pathlib import Path

import pytest
import typer.main
import yaml

from tidemark.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
SPARK_MAINS = {
    "org.apache.spark.deploy.master.Master": "org/apache/spark/deploy/master/MasterArguments.class",
    "org.apache.spark.deploy.worker.Worker": "org/apache/spark/deploy/worker/WorkerArguments.class",
}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def argv(service: dict) -> list[str]:
    command = service.get("command")
    if command is None:
        return []
    return list(command) if isinstance(command, list) else shlex.split(command)


def flags(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


def submit_conf(service: dict) -> dict[str, str]:
    args = shlex.split(service.get("environment", {}).get("PYSPARK_SUBMIT_ARGS", ""))
    return dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--conf")


def test_services_and_images(compose):
    services = compose["services"]
    assert {"kafka", "spark-master", "spark-worker", "control", "index", "prometheus", "grafana"} <= set(services)
    assert services["kafka"]["image"].startswith("apache/kafka:")
    for name, svc in services.items():
        assert svc.get("image"), f"service {name} has no image"
    tidemark_services = [n for n, s in services.items() if s["image"].startswith("${TIDEMARK_IMAGE")]
    assert {"spark-master", "spark-worker", "control", "index"} <= set(tidemark_services)
    for name in tidemark_services:
        build = services[name]["build"]
        assert (ROOT / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    # the compose fragment was merged into the top-level file
    assert not (ROOT / "deploy" / "docker-compose.control.yml").exists()


def test_kafka_runs_in_kraft_mode_with_transactions_on_one_node(compose):
    env = compose["services"]["kafka"]["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert not any("ZOOKEEPER" in k for k in env)
    voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"]
    assert voters == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    # the sinks write in transactions: one broker means replication factor 1 for its log
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == 1
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == 1
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")


def test_tidemark_commands_and_flags_exist(compose):
    cli = typer.main.get_command(app)
    checked = []
    for name, svc in compose["services"].items():
        args = argv(svc)
        if not args or args[0] != "tidemark":
            continue
        sub = args[1]
        assert sub in cli.commands, f"{name}: `tidemark {sub}` is not a command ({sorted(cli.commands)})"
        known = {opt for p in cli.commands[sub].params for opt in p.opts}
        unknown = [f for f in flags(args[2:]) if f not in known]
        assert not unknown, f"{name}: `tidemark {sub}` has no options {unknown}"
        checked.append(sub)
    assert {"control", "run", "index"} <= set(checked)


def test_spark_commands_name_real_classes_and_flags(compose):
    [jar] = glob.glob(os.path.join(os.path.dirname(__import__("pyspark").__file__), "jars", "spark-core_*.jar"))
    classes = zipfile.ZipFile(jar)
    for name in ("spark-master", "spark-worker"):
        args = argv(compose["services"][name])
        assert args[0] == "spark-class"
        main = args[1]
        assert main in SPARK_MAINS, f"{name}: unexpected main class {main}"
        assert classes.getinfo(main.replace(".", "/") + ".class")
        accepted = set(re.findall(rb"--[a-z][a-z-]+", classes.read(SPARK_MAINS[main])))
        unknown = [f for f in flags(args[2:]) if f.encode() not in accepted]
        assert not unknown, f"{name}: {main} does not accept {unknown}"
    worker = argv(compose["services"]["spark-worker"])
    master = argv(compose["services"]["spark-master"])
    assert worker[-1] == f"spark://{master[master.index('--host') + 1]}:{master[master.index('--port') + 1]}"


def test_drivers_reach_the_master_and_executors_reach_the_drivers(compose):
    services = compose["services"]
    master = argv(services["spark-master"])
    url = f"spark://{master[master.index('--host') + 1]}:{master[master.index('--port') + 1]}"
    for name in ("control", "pipeline"):
        args = argv(services[name])
        assert args[args.index("--master") + 1] == url
        assert args[args.index("--bootstrap-servers") + 1] == "kafka:9092"
        # executors connect back to the driver by this name: it must be the container's
        assert submit_conf(services[name])["spark.driver.host"] == services[name]["hostname"] == name


def test_checkpoints_are_shared_by_drivers_and_executors(compose):
    services = compose["services"]
    control = argv(services["control"])
    root = control[control.index("--checkpoint-root") + 1]

    def volume_at(svc: dict, path: str) -> str | None:
        for vol in svc.get("volumes", []):
            source, target = vol.split(":")[:2]
            if target == path:
                return source
        return None

    assert volume_at(services["control"], root) == "checkpoints"
    assert volume_at(services["spark-worker"], root) == "checkpoints"
    assert "checkpoints" in compose["volumes"]


def test_bound_files_exist(compose):
    bound = []
    for name, svc in compose["services"].items():
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
                bound.append(source)
            else:
                assert source in compose["volumes"], f"{name}: undeclared volume {source}"
    assert "./deploy/prometheus.yml" in bound
    dashboards = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/tidemark.yml").read_text())
    dash_dir = dashboards["providers"][0]["options"]["path"]
    grafana = [v.split(":")[1] for v in compose["services"]["grafana"]["volumes"]]
    assert any(target.startswith(dash_dir + "/") for target in grafana)


def test_prometheus_scrapes_the_control_and_index_services(compose):
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    targets = [t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    for name in ("control", "index"):
        args = argv(compose["services"][name])
        assert f"{name}:{args[args.index('--port') + 1]}" in targets


def test_healthchecks_probe_each_services_own_port(compose):
    for name in ("control", "index"):
        svc = compose["services"][name]
        args = argv(svc)
        probe = " ".join(svc["healthcheck"]["test"])
        assert f"http://127.0.0.1:{args[args.index('--port') + 1]}/readyz" in probe, name
        assert args[args.index("--host") + 1] == "0.0.0.0", f"{name} must listen beyond the container's loopback"


def test_control_registers_delta_joins_with_the_index_service(compose):
    from tidemark.control.indexes import INDEX_TOKEN_ENV

    services = compose["services"]
    index, control = argv(services["index"]), argv(services["control"])
    assert control[control.index("--index-url") + 1] == (
        f"http://{services['index']['hostname']}:{index[index.index('--port') + 1]}")
    assert index[index.index("--bootstrap-servers") + 1] == control[control.index("--bootstrap-servers") + 1]
    # the token the control service (and its jobs) send is the one the index service checks
    assert services["control"]["environment"][INDEX_TOKEN_ENV] == services["index"]["environment"][INDEX_TOKEN_ENV]
    # pipelines are only registered once the index service answers
    assert services["control"]["depends_on"]["index"] == {"condition": "service_healthy"}


def test_dockerfile_builds_the_cli_image():
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11", text, re.M)
    assert "openjdk-17-jre-headless" in text
    assert re.search(r"^RUN pip install \.", text, re.M)
    for line in re.findall(r"^COPY (\S+) ", text, re.M):
        assert (ROOT / line).exists(), f"Dockerfile copies missing {line}"
    example = "/opt/tidemark/examples/"
    assert example in text
    compose_text = COMPOSE.read_text(encoding="utf-8")
    for path in re.findall(re.escape(example) + r"(\S+)", compose_text):
        assert (ROOT / "examples" / path).exists(), f"compose runs missing examples/{path}"
