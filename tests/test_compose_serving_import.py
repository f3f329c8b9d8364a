"""The import of a serving-shaped Compose file (issue 25, points 4 and 4b): no workers and no check -> config
`mode: serve`; a migration an API waits for -> an init job; `deploy.mode: global` -> `services.<name>.mode: global`."""

from __future__ import annotations

from test_compose_import import import_document

SERVING = {"services": {
    "db": {"image": "postgres:16", "healthcheck": {"test": ["CMD", "pg_isready"], "interval": "5s"}},
    "migrate": {"image": "api", "command": ["python", "migrate.py"],
                "depends_on": {"db": {"condition": "service_healthy"}}},
    "api": {"image": "api", "command": ["uvicorn", "app:app", "--port", "8000"], "ports": ["8000:8000"],
            "depends_on": {"db": {"condition": "service_healthy"},
                           "migrate": {"condition": "service_completed_successfully"}}},
    "agent": {"image": "agent", "command": ["agent"], "deploy": {"mode": "global"}},
}}


def test_a_database_an_api_and_its_migration_import_as_a_serving_stack(tmp_path, capsys, monkeypatch):
    code, config, _ = import_document(tmp_path, SERVING, monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    assert code == 0 and config["mode"] == "serve", out
    assert config["init_jobs"] == ["migrate"] and set(config["services"]) == {"db", "migrate", "api", "agent"}
    assert config["services"]["api"]["depends_on"] == ["db", "migrate"]
    assert "no workers and no check: a serving stack (mode: serve)" in out and "0 gap(s)" in out
    assert "then it serves" in config["decisions"]["startup_order"]["how"]


def test_deploy_mode_global_is_a_service_on_every_node(tmp_path, capsys, monkeypatch):
    code, config, _ = import_document(tmp_path, SERVING, monkeypatch=monkeypatch)
    assert code == 0 and config["services"]["agent"]["mode"] == "global"
    assert "mode" not in config["services"]["api"]  # replicated: the default
    assert "deploy.mode global -> services.agent.mode: global" in capsys.readouterr().out


def test_deploy_mode_global_for_the_workers_is_refused_by_name(tmp_path, capsys, monkeypatch):
    document = {"services": {
        "redis": {"image": "redis:7", "ports": ["6379"]},
        "worker": {"image": "w", "command": ["rq", "worker", "--burst"], "deploy": {"mode": "global", "replicas": 3},
                   "depends_on": ["redis"]},
        "check": {"image": "w", "command": ["python", "check.py"],
                  "depends_on": {"worker": {"condition": "service_completed_successfully"}}},
    }}
    code, config, _ = import_document(tmp_path, document, monkeypatch=monkeypatch)
    assert code == 65  # [compose]: refused, nothing written
    assert config is None
    assert "services.worker.deploy.mode: global: only a service (not the workers) runs once per node" in \
        capsys.readouterr().err


def test_a_celery_worker_as_a_service_that_nothing_depends_on_needs_no_port_and_no_healthcheck(tmp_path, capsys,
                                                                                                 monkeypatch):
    """A worker daemon of a served stack (`docker compose up`, one `celery worker`): it publishes nothing and nothing
    waits for it, so the import gives it no probe (ready once started; the plan then runs no gate for it) and no
    refusal or gap for lacking a port or a healthcheck, even with an image whose EXPOSE is unknown."""
    document = {"services": {
        "redis": {"image": "redis:7"},
        "web": {"build": "./project", "command": "uvicorn main:app --port 8000", "ports": ["8004:8000"],
                "depends_on": ["redis"]},
        "worker": {"build": "./project", "command": "celery -A worker.celery worker", "depends_on": ["web", "redis"]},
    }}
    code, config, _ = import_document(tmp_path, document, monkeypatch=monkeypatch)
    out = capsys.readouterr().out
    assert code == 0 and config["mode"] == "serve" and "0 gap(s)" in out, out
    worker = config["services"]["worker-service"]
    assert worker["readiness"] == {"mode": "started"} and worker["port"] is None
    assert "worker: no healthcheck and no port, and nothing waits for it: ready once started" in out
