"""Where this project lives: the documentation link and logo every block shows in Prefect."""

from __future__ import annotations

import logging
import os
from urllib.parse import urlsplit

#: The project's home; its README is the documentation each block links to.
PROJECT_URL = "https://github.com/prefect-coder/prefect-coder"
DOCS_URL = f"{PROJECT_URL}#readme"
#: The logo shipped beside the blocks (prefect_coder/blocks/logo.png), as the project's
#: home serves it.
HOSTED_LOGO_URL = f"{PROJECT_URL}/raw/main/prefect_coder/blocks/logo.png"
#: Where a team whose browsers cannot reach the project's home serves that file itself.
LOGO_URL_VARIABLE = "PREFECT_CODER_LOGO_URL"


class LogoUrl:
    """A block type's logo address, read whenever Prefect registers the type (every save
    does), not once at import: ``PREFECT_CODER_LOGO_URL`` when it is set, the hosted copy
    otherwise. Prefect's schema takes only an http(s) address, so an offline UI shows the
    logo only if someone on its network serves it."""

    def __get__(self, instance: object, owner: type | None = None) -> str:
        served = os.environ.get(LOGO_URL_VARIABLE, "")
        if not served:
            return HOSTED_LOGO_URL
        parts = urlsplit(served)
        if parts.scheme in ("http", "https") and parts.netloc:
            return served
        # Prefect would refuse the block type, and so every save of a block: say so (once
        # per value: every save reads it again), go on.
        if served not in _REFUSED:
            _REFUSED.add(served)
            logging.getLogger("prefect_coder.blocks").warning(
                "%s=%r is not an http(s) address; the blocks keep the hosted logo",
                LOGO_URL_VARIABLE,
                served,
            )
        return HOSTED_LOGO_URL


#: The refused values of ``PREFECT_CODER_LOGO_URL`` already warned about.
_REFUSED: set[str] = set()
