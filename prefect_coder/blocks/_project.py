"""Where this project lives: the documentation link and logo every block shows in Prefect."""

from __future__ import annotations

#: The project's home; its README is the documentation each block links to.
PROJECT_URL = "https://github.com/prefect-coder/prefect-coder"
DOCS_URL = f"{PROJECT_URL}#readme"
#: The logo committed beside the blocks (prefect_coder/blocks/logo.png), as the UI fetches it.
LOGO_URL = f"{PROJECT_URL}/raw/main/prefect_coder/blocks/logo.png"
