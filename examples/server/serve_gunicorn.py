"""An inference server that records how it is called: gunicorn, uvicorn workers, a tiny Llama.

This one file is both the ASGI application and its gunicorn configuration::

    CAPTURE_STORE=/var/lib/capture gunicorn -c examples/server/serve_gunicorn.py serve_gunicorn:app

Each worker builds the model and starts **its own recorder after the fork** (gunicorn's
``post_worker_init`` hook), and stops it when it exits (``worker_exit``): every worker writes its
own files, and no recorder thread crosses a fork. What gunicorn does to workers keeps every call
of every answered request:

- recycling (``max_requests``) and a graceful stop end the worker normally: ``worker_exit``
  stops the recorder, which writes what it buffered;
- a graceful reload (SIGHUP to the master) and a shutdown (SIGTERM to the master) send SIGTERM
  to the workers; uvicorn finishes the requests in flight, then hands the signal on, and the
  recorder's handler writes every buffered call before the worker dies of it.

``POST /generate`` with ``{"request_id": ..., "prompt_len": 5, "max_new_tokens": 3}`` runs a
greedy ``generate()`` and answers ``{"request_id", "pid", "calls"}``: ``calls`` is how many
forward calls the request made (a forward pre-hook counts them per request), so a client can
reconcile what it was served with what the store holds. ``GET /health`` answers ``ok``.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
from typing import Any

# -- gunicorn settings (``-c serve_gunicorn.py``; the command line overrides them) --------------
pythonpath = os.path.dirname(os.path.abspath(__file__))  # the app is this file's module
bind = "127.0.0.1:8000"
workers = 2
worker_class = "uvicorn_worker.UvicornWorker"
max_requests = 200  # recycle a worker after this many requests
graceful_timeout = 30  # seconds a stopping worker has to finish its requests
control_socket_disable = True  # gunicorn >= 25 opens one in ~/.gunicorn; not needed here


def post_worker_init(worker: Any) -> None:
    """gunicorn hook, in each new worker after the fork: build the model, start recording."""
    worker.wsgi.start()


def worker_exit(server: Any, worker: Any) -> None:
    """gunicorn hook, in a worker that is exiting: write what the recorder buffered."""
    worker.wsgi.stop()


# -- the application -------------------------------------------------------------------------
_calls: contextvars.ContextVar[list[int]] = contextvars.ContextVar("calls")


class Server:
    """The ASGI application: one model and one recorder per worker process."""

    def __init__(self) -> None:
        self.model: Any = None
        self.recorder: Any = None

    def start(self) -> None:
        """Builds the model and starts this worker's recorder (call after the fork)."""
        import torch

        import capture
        from capture.demo_model import tiny_llama

        torch.set_num_threads(1)  # one thread per worker: the workers share the cores
        self.model = tiny_llama(0)
        self.model.register_forward_pre_hook(_count_call)
        store = os.environ.get("CAPTURE_STORE", "capture-store")
        self.recorder = capture.Recorder(self.model, store, name="llama", flush_seconds=1.0)
        self.recorder.start()

    def stop(self) -> None:
        """Stops the recorder (it writes the calls it buffered)."""
        if self.recorder is not None:
            self.recorder.stop()

    def generate(self, prompt_len: int, max_new_tokens: int, seed: int) -> int:
        """Runs one greedy generate(); returns how many forward calls it made."""
        import torch

        from capture.demo_model import prompts

        counter = [0]
        _calls.set(counter)
        with torch.no_grad():
            self.model.generate(
                **prompts(1, prompt_len, seed=seed),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        return counter[0]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["path"] == "/health":
            await _answer(send, 200, {"status": "ok", "pid": os.getpid()})
            return
        if scope["path"] != "/generate" or scope["method"] != "POST":
            await _answer(send, 404, {"error": "POST /generate or GET /health"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            request = json.loads(body)
            prompt_len = int(request["prompt_len"])
            new_tokens = int(request["max_new_tokens"])
            if not (1 <= prompt_len <= 64 and 1 <= new_tokens <= 16):
                raise ValueError("prompt_len within [1, 64], max_new_tokens within [1, 16]")
        except (ValueError, KeyError, TypeError) as e:
            await _answer(send, 400, {"error": str(e)})
            return
        # off the event loop, in the request's context (the pre-hook counts into it)
        calls = await asyncio.to_thread(self.generate, prompt_len, new_tokens, prompt_len)
        answer = {"request_id": request.get("request_id"), "pid": os.getpid(), "calls": calls}
        await _answer(send, 200, answer)


def _count_call(module: Any, args: Any) -> None:
    counter = _calls.get(None)
    if counter is not None:
        counter[0] += 1


async def _answer(send: Any, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


app = Server()
