"""An import-linter contract: Flower's modules beyond its public API are imported by one package only.

import-linter sees an external package only whole (``flwr``), so this contract reads the line of every
import of it (grimp's import details, imports inside functions included) and keeps it only where the
module is public (``public_modules``) or the importer lies in ``gate`` (pyproject.toml names both).
"""

from __future__ import annotations

import re
from typing import Any

from importlinter import Contract, ContractCheck, fields, output

FLOWER_IMPORT = re.compile(r"^\s*(?:from\s+(flwr[\w.]*)\s+import|import\s+(flwr[\w.]*))")


class PublicFlowerContract(Contract):
    """``source_modules`` import Flower (``external``) only through ``public_modules``, unless they are in ``gate``."""

    source_modules = fields.ListField(subfield=fields.ModuleField())
    gate = fields.ModuleField()
    external = fields.StringField()
    public_modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph: Any, verbose: bool) -> ContractCheck:
        public = {str(m) for m in self.public_modules}  # type: ignore[attr-defined]
        gate = str(self.gate.name)  # type: ignore[attr-defined]
        found = []
        for source in self.source_modules:  # type: ignore[attr-defined]
            for importer in sorted(graph.find_descendants(source.name) | {source.name}):
                if importer == gate or importer.startswith(gate + "."):
                    continue
                for detail in graph.get_import_details(importer=importer, imported=str(self.external)):  # type: ignore[attr-defined]
                    match = FLOWER_IMPORT.match(detail["line_contents"])
                    module = next((g for g in match.groups() if g), "") if match else detail["line_contents"]
                    if module not in public:
                        found.append((importer, detail["line_number"], detail["line_contents"].strip()))
        return ContractCheck(kept=not found, metadata={"found": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for importer, line, contents in check.metadata["found"]:
            output.print_error(f"{importer}:{line}: {contents}", bold=False)
        output.new_line()
