"""The browser tests' own helper: a 500 from jupyter_server's half-started-kernel race is waited out, any other
500 still fails (a stand-in server answers as jupyter_server 2.21.1 did under load)."""

import http.server
import json
import threading
import urllib.error
from pathlib import Path

import pytest
from _jupyterlab import JupyterLab

RACE_LOG = "TraitError: The 'last_activity' trait of a ServerKernelManager instance expected a datetime\n"


@pytest.fixture
def server():
    """A server whose ``/api/kernels`` answers with the status and body in ``answer``."""
    answer = {"status": 200, "body": []}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(answer["body"]).encode()
            self.send_response(answer["status"])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", answer
    httpd.shutdown()
    httpd.server_close()


def lab_at(base: str, log: Path) -> JupyterLab:
    return JupyterLab(base=base, token="t", notebook="n.ipynb", server=None, log=log)  # type: ignore[arg-type]


def test_kernel_ids_reads_the_list_waits_out_the_race_and_raises_other_errors(server, tmp_path):
    base, answer = server
    log = tmp_path / "jupyterlab.log"
    log.write_text("[I ServerApp] Jupyter Server is running\n")
    answer["body"] = [{"id": "a"}, {"id": "b"}]
    assert lab_at(base, log).kernel_ids() == ["a", "b"]
    answer["status"] = 500
    with pytest.raises(urllib.error.HTTPError):  # a 500 the log does not explain is a failure
        lab_at(base, log).kernel_ids()
    log.write_text(log.read_text() + RACE_LOG)
    assert lab_at(base, log).kernel_ids() is None  # the race: kernels still changing
    answer["status"] = 404
    with pytest.raises(urllib.error.HTTPError):
        lab_at(base, log).kernel_ids()
