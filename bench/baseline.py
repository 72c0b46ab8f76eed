"""The documented sample approach, as the contender to beat.

Microsoft's sample: a loop that GETs the document (a new connection each time), parses it,
runs the hooks for new events of this VM synchronously, POSTs the approval synchronously,
then sleeps one second. Written plainly on purpose; it is what most VMs run today.

Usage: python -m bench.baseline URL VM_NAME HOOK
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import requests


def main() -> int:
    url, vm_name, hook = sys.argv[1], sys.argv[2], sys.argv[3]
    params = {"api-version": "2020-07-01"}
    headers = {"Metadata": "true"}
    handled: set[str] = set()
    proxies = {"http": "", "https": ""}
    while True:
        try:
            doc = requests.get(
                url, params=params, headers=headers, timeout=5, proxies=proxies
            ).json()
        except (requests.RequestException, ValueError):
            time.sleep(1)
            continue
        for event in doc.get("Events", []):
            event_id = event.get("EventId")
            if event_id in handled or vm_name not in event.get("Resources", []):
                continue
            handled.add(event_id)
            if event.get("EventStatus") != "Scheduled":
                continue
            env = dict(os.environ, SCHEDULED_EVENT_ID=event_id)
            result = subprocess.run([hook], env=env, input=json.dumps(event).encode(), check=False)
            if result.returncode == 0:
                body = {"StartRequests": [{"EventId": event_id}]}
                with contextlib.suppress(requests.RequestException):
                    requests.post(
                        url, params=params, headers=headers, json=body, timeout=5, proxies=proxies
                    )
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
