"""``saas-jobs ...``: the Litestar CLI with this project's app, so ``--app`` can be left out."""

from __future__ import annotations

import os


def main() -> None:
    os.environ.setdefault("LITESTAR_APP", "app.asgi:create_app")
    from litestar.cli.main import litestar_group

    litestar_group()


if __name__ == "__main__":
    main()
