"""Nothing of the fleet's secrets reaches anyone who should not have it.

- **the token**: the Coder session token is nowhere our side of the fleet wrote
  (:mod:`.leaks`): not in Prefect's database outside the block's encrypted value, not
  in the store, not in any file of the control, store or worker hosts.
- **the door**: Prefect's API answered a client without its auth string with 401 to
  every ask (the blocks, the Coder credentials with their secrets, the flow runs), and
  the same asks with it were answered (so the door is shut by the auth string, not by
  something else that would also stop the workers).
"""

from __future__ import annotations

from .evidence import Evidence
from .verdicts import Findings


def check_secrets(ev: Evidence) -> Findings:
    findings = Findings()
    for place in ev.token_found:
        findings.add("exposed secrets", f"the Coder token is in {place}")
    if ev.door is not None and not ev.door.shut:
        findings.add("exposed secrets", f"Prefect's API {ev.door.describe()}")
    return findings
