"""What a user writes instead of `jaxtpu serve`: a transformers text-classification pipeline of
an export behind a minimal Starlette handler, one request at a time (a lock around the model),
answering `{"comment": {"text": ...}}` with the pipeline's scores. `benchmarks.serving.throughput`
drives it: `python -m benchmarks.serving.baseline EXPORT_DIR [PORT]`."""

from __future__ import annotations

import asyncio
import socket
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


def main() -> None:
    from transformers import pipeline

    clf = pipeline("text-classification", model=sys.argv[1], top_k=None, truncation=True)
    lock = asyncio.Lock()

    async def analyze(request: Request) -> JSONResponse:
        body = await request.json()
        async with lock:
            scores = clf(body["comment"]["text"])
        return JSONResponse({"scores": scores})

    async def ready(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ready"})

    app = Starlette(
        routes=[
            Route("/v1alpha1/comments:analyze", analyze, methods=["POST"]),
            Route("/readyz", ready),
        ]
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", int(sys.argv[2]) if len(sys.argv) > 2 else 0))
    sock.listen(256)
    print(f"baseline http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    main()
