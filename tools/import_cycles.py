"""An import-linter contract type: no import circle between any two files of the root packages.

import-linter's own contracts check layers and circles between sibling packages; this one looks at single
modules: every strongly connected component of the import graph (as import-linter builds it: imports inside
functions included, ``if TYPE_CHECKING:`` imports left out when the session says so) must be one module.
`make lint` runs it through ``lint-imports`` with the layers contract (pyproject.toml, [tool.importlinter]).
"""

from __future__ import annotations

import grimp
from importlinter.application import output
from importlinter.domain.contract import Contract, ContractCheck


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every import circle: the strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


class AcyclicModulesContract(Contract):
    """Kept when no two modules import each other, directly or through others."""

    type_name = "acyclic_modules"

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        found = cycles(graph)
        examples = []
        for component in found:  # one concrete circle per component, for the message
            first, members = component[0], set(component)
            back = next(m for m in component if first in graph.find_modules_directly_imported_by(m))
            chain = graph.find_shortest_chain(importer=first, imported=back) or [first, back]
            examples.append([*chain, first] if all(m in members for m in chain) else component)
        return ContractCheck(kept=not found, warnings=[], metadata={"cycles": examples})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for chain in check.metadata["cycles"]:
            output.print_error(" -> ".join(chain))
            output.new_line()
        output.print("Break each circle: move the shared piece down a layer, or import it where it is used.")
