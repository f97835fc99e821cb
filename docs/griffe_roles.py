"""A Griffe extension for the API reference: cubepack's docstrings cross-reference with Sphinx
roles (``:func:`verify```, ``:class:`~cubepack.trust.TrustPolicy```), which mkdocstrings does
not read: rendered as is, the page showed ``:func:`` before each name. Each role becomes a
cross-reference mkdocs-autorefs resolves: a link to where the site documents the object (under
its own path, or under the public name it is exported as). A reference to a public object the
site does not document fails the strict build; one to a private helper shows its name as code.
Loaded by mkdocs.yml (mkdocstrings' ``extensions``).

A role's target is resolved as Sphinx does: a dotted path as written (a leading ``.`` relative
to the docstring's package), a bare name in the scope of the object whose docstring it is (its
members, then its parents': a name a module imports resolves to the object it imports); ``~``
shows the last part only.
"""

from __future__ import annotations

import html
import re

import griffe

ROLE = re.compile(r":(?:func|class|meth|data|mod|attr|exc|obj):`(~?)([.\w]+)`")


class SphinxRoles(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        public = _public_names(pkg)
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = ROLE.sub(
                    lambda match, obj=obj: _reference(obj, *match.groups(), public),
                    obj.docstring.value)


def _objects(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)


def _public_names(pkg: griffe.Module) -> dict[str, str]:
    """Where each object is defined -> the shortest public path it is exported as (the one
    the API reference documents: ``cubepack.kv._load.load_kv_cache`` -> ``cubepack.load_kv_cache``)."""
    found: dict[str, str] = {}
    stack = [pkg]
    while stack:
        module = stack.pop()
        for member in module.members.values():
            if not member.is_alias:
                if member.is_module:
                    stack.append(member)
                continue
            if any(part.startswith("_") for part in member.path.split(".")):
                continue
            try:
                defined = member.final_target.path
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue
            if defined not in found or len(member.path) < len(found[defined]):
                found[defined] = member.path
    return found


def _reference(obj: griffe.Object, short: str, name: str, public: dict[str, str]) -> str:
    """The role as an autoref: required for a public object (a reference the site cannot
    resolve fails the strict build), optional for a private one (shown as code)."""
    target = _resolve(obj, name)
    target = public.get(target, target)
    shown = name.lstrip(".").rsplit(".", 1)[-1] if short else name.lstrip(".")
    private = any(part.startswith("_") for part in target.split("."))
    return (f'<autoref identifier="{html.escape(target)}" class="docstring-role"'
            f'{" optional" if private else ""}><code>{html.escape(shown)}</code></autoref>')


def _resolve(obj: griffe.Object, name: str) -> str:
    if name.startswith("."):  # relative to the docstring's package, as an import would be
        module = obj if obj.is_module else obj.module
        package = module.path if module.is_package else module.path.rsplit(".", 1)[0]
        dots = len(name) - len(name.lstrip("."))
        base = package.rsplit(".", dots - 1)[0] if dots > 1 else package
        return f"{base}.{name.lstrip('.')}"
    head, _, rest = name.partition(".")
    try:
        resolved = obj.resolve(head)
    except griffe.NameResolutionError:
        return name
    return f"{resolved}.{rest}" if rest else resolved
