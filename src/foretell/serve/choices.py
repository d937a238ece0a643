"""A request's n choices as one: each choice is a Job of its own in the batch (so they decode together, one
target pass verifying all their drafts), and the request reads their chunks merged, in arrival order."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from foretell.types import Chunk
from foretell.serve.worker import Job

_FINISHED = object()


class Choices:
    def __init__(self, jobs: list[Job]):
        self.jobs = jobs

    @property
    def n(self) -> int:
        return len(self.jobs)

    def cancel(self, reason: str) -> None:
        """Every choice leaves the batch (a no-op for those that finished)."""
        for job in self.jobs:
            job.cancel(reason)

    async def chunks(self) -> AsyncIterator[tuple[int, Chunk]]:
        """(choice index, chunk) as they come; the first error of any choice ends them all and is raised."""
        if self.n == 1:
            async for chunk in self.jobs[0].chunks():
                yield 0, chunk
            return
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, job: Job) -> None:
            try:
                async for chunk in job.chunks():
                    await merged.put((index, chunk))
                await merged.put((index, _FINISHED))
            except Exception as e:  # handed to the reader, which raises it
                await merged.put((index, e))

        tasks = [asyncio.create_task(pump(i, job)) for i, job in enumerate(self.jobs)]
        try:
            running = self.n
            while running:
                index, item = await merged.get()
                if item is _FINISHED:
                    running -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield index, item
        finally:
            for task in tasks:
                task.cancel()
            self.cancel("cancelled")
