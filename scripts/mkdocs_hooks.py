"""mkdocs hooks (mkdocs.yml: hooks): add reference/c-api.md, generated from
include/nexar.h by scripts/gen_capi_docs.py, to the site as a page that
exists only in the build (nothing generated is written into docs/)."""

import os
import sys

from mkdocs.structure.files import File

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_capi_docs  # noqa: E402


def on_files(files, config):
    files.append(File.generated(config, "reference/c-api.md", content=gen_capi_docs.render()))
    return files
