"""Fair share over the account tree: Slurm's classic algorithm (PriorityFlags=NO_FAIR_TREE).

The tree is root → accounts (nested through ``parent``) → users. For every node:

  normalised shares  S  = product along the path of  shares / shares of all siblings
  normalised usage   U  = decayed usage of the subtree / decayed usage of everything
  effective usage    UE = U                                   (accounts under the root)
                     UE = U + (UE_parent − U) · shares/siblings  (deeper nodes)
  fair-share factor  F  = 2^(−UE / S)

so a user who used exactly their share of an account that used exactly its share gets 0.5,
an idle one gets towards 1, a heavy one towards 0, and a heavy account drags its users
down. Usage is what the caller charges (GPU-seconds plus weighted CPU- and GB-seconds)
decayed with the half-life; it arrives per (account, user) association.

Accounts not in the configuration (or every account, when none is configured) sit under
the root with one share each; users not listed under an account get one share of it."""

from __future__ import annotations

from dataclasses import dataclass

from corral.scheduler.policy import Account, Policy

Assoc = tuple[str, str]  # (account, user)


@dataclass(frozen=True)
class ShareRow:
    """One line of ``corral share`` (Slurm's sshare)."""

    account: str
    user: str  # "" for an account line
    depth: int
    raw_shares: float
    norm_shares: float
    raw_usage: float
    norm_usage: float
    effective_usage: float
    fair_share: float


@dataclass
class _Node:
    name: str
    shares: float
    parent: _Node | None
    children: list[_Node]
    usage: float = 0.0
    depth: int = 0
    is_user: bool = False


def _tree(policy: Policy, usage: dict[Assoc, float], extra: set[Assoc]) -> tuple[_Node, dict[Assoc, _Node],
                                                                                     dict[str, _Node]]:
    root = _Node("root", 1.0, None, [])
    accounts: dict[str, _Node] = {}
    configured: dict[str, Account] = {a.name: a for a in policy.accounts}

    def account(name: str) -> _Node:
        if name in accounts:
            return accounts[name]
        spec = configured.get(name)
        parent = account(spec.parent) if spec is not None and spec.parent else root
        node = _Node(name, spec.shares if spec is not None else 1.0, parent, [], depth=parent.depth + 1)
        parent.children.append(node)
        accounts[name] = node
        return node

    for spec in policy.accounts:
        account(spec.name)
    users: dict[Assoc, _Node] = {}

    def user(assoc: Assoc) -> _Node:
        if assoc not in users:
            parent = account(assoc[0])
            node = _Node(assoc[1], 1.0, parent, [], depth=parent.depth + 1, is_user=True)
            parent.children.append(node)
            users[assoc] = node
        return users[assoc]

    for spec in policy.accounts:
        for name in spec.users:
            user((spec.name, name))
    for assoc in sorted(set(usage) | extra):
        node = user(assoc)
        amount = usage.get(assoc, 0.0)
        while node is not None:
            node.usage += amount
            node = node.parent
    return root, users, accounts


def entitlements(policy: Policy, active: set[Assoc]) -> dict[Assoc, float]:
    """The fraction of the cluster each active association may count on: its normalised
    shares with only the active part of the tree counted (an idle user's or account's shares
    go to its active siblings, as Kueue lends unused quota), so they sum to 1."""
    root, users, _ = _tree(policy, {}, set(active))
    live: set[int] = set()
    for assoc in active:
        node = users[assoc]
        while node is not None and id(node) not in live:
            live.add(id(node))
            node = node.parent
    out: dict[Assoc, float] = {}
    for assoc in active:
        node, share = users[assoc], 1.0
        while node.parent is not None:
            siblings = sum(c.shares for c in node.parent.children if id(c) in live)
            share *= node.shares / siblings if siblings > 0 else 0.0
            node = node.parent
        out[assoc] = share
    return out


def factors(policy: Policy, usage: dict[Assoc, float], assocs: set[Assoc]) -> dict[Assoc, float]:
    """The fair-share factor of each association asked for."""
    rows = report(policy, usage, assocs)
    return {(r.account, r.user): r.fair_share for r in rows if r.user}


def report(policy: Policy, usage: dict[Assoc, float], assocs: set[Assoc] = frozenset()) -> list[ShareRow]:
    root, _, _ = _tree(policy, usage, set(assocs))
    total = root.usage
    rows: list[ShareRow] = []

    def walk(node: _Node, norm_parent: float, eff_parent: float | None, account: str) -> None:
        siblings = sum(c.shares for c in node.parent.children) if node.parent else node.shares
        local = node.shares / siblings if siblings > 0 else 0.0
        norm = norm_parent * local
        used = node.usage / total if total > 0 else 0.0
        effective = used if eff_parent is None else used + (eff_parent - used) * local
        factor = 2.0 ** (-effective / norm) if norm > 0 else 0.0
        rows.append(ShareRow(account if node.is_user else node.name, node.name if node.is_user else "", node.depth - 1,
                             node.shares, norm, node.usage, used, effective, factor))
        for child in sorted(node.children, key=lambda c: c.name):
            walk(child, norm, effective, node.name)

    for child in sorted(root.children, key=lambda c: c.name):
        walk(child, 1.0, None, "")
    return rows

