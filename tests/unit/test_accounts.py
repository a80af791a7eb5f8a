"""Which Unix account a corral user's job runs as (``corral.auth.accounts``): the same name
by default or config.yaml's mapping; a server that is not root runs only its own account's
jobs unless its account is declared a shared service account; a user without an account, or
on an infra whose workers are one other account, is refused with a sentence naming them."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.auth.accounts import AccountRefusal, Accounts, IdentityConfig, account_to_start, server_account


def test_a_server_that_is_not_root_runs_only_its_own_accounts_jobs() -> None:
    accounts = Accounts(IdentityConfig(unix_accounts={"svc-bot": "corral"}), server="corral", root=False)
    assert accounts.run_as("corral") == "corral"
    assert accounts.run_as("svc-bot") == "corral"  # mapped to the server's own account
    with pytest.raises(AccountRefusal) as refused:
        accounts.run_as("bob")
    assert str(refused.value) == (
        "this corral server runs as corral, not root, so it can start jobs only as corral, and bob's jobs run as "
        "the Unix account bob: run the server as root, or declare corral a shared service account (config.yaml "
        "identity: service_account: corral)")


def test_a_declared_service_account_runs_everyones_jobs() -> None:
    for root in (False, True):
        accounts = Accounts(IdentityConfig(service_account="corral"), server="corral", root=root)
        assert accounts.run_as("bob") == accounts.run_as("ann") == "corral"
    with pytest.raises(ValueError, match="a shared service account is the server's own account"):
        Accounts(IdentityConfig(service_account="someone"), server="corral", root=False)


def test_a_root_server_maps_users_to_accounts_and_refuses_those_without_one() -> None:
    accounts = Accounts(IdentityConfig(unix_accounts={"admin-token": "root", "ghost": "nosuchacct-zz"}),
                        server="root", root=True)
    assert accounts.run_as("root") == "root"
    assert accounts.run_as("admin-token") == "root"
    with pytest.raises(AccountRefusal) as refused:
        accounts.run_as("nosuchuser-zz")
    assert str(refused.value).startswith("user nosuchuser-zz has no Unix account on this server: there is no "
                                         "account 'nosuchuser-zz'")
    with pytest.raises(AccountRefusal, match=r"maps it to nosuchacct-zz"):
        accounts.run_as("ghost")


def test_an_infra_of_one_account_refuses_the_others() -> None:
    accounts = Accounts(IdentityConfig(), server="root", root=True)
    assert accounts.run_as("root", only="root") == "root"
    with pytest.raises(AccountRefusal) as refused:
        accounts.run_as("root", only="raysvc", where="partition gpu (infra ray)")
    assert str(refused.value) == ("partition gpu (infra ray) runs every job as the Unix account raysvc (its "
                                  "workers' user), and root's jobs run as root: submit to another partition")


def test_nothing_is_switched_for_the_servers_own_account() -> None:
    assert account_to_start(None) is None
    assert account_to_start(server_account()) is None


def test_config_names_the_field_of_a_service_account_that_is_not_the_servers(tmp_path: Path) -> None:
    from corral.site import load_site
    from corral.spec.loader import SpecError

    config = tmp_path / "config.yaml"
    config.write_text("identity:\n  service_account: not-the-server\n")
    with pytest.raises(SpecError) as bad:
        load_site(config)
    assert "identity.service_account" in str(bad.value) and "not this server's account" in str(bad.value)
    config.write_text("identity:\n  unix_accounts: {ann: ann_hpc}\n")
    assert load_site(config).identity.unix_accounts == {"ann": "ann_hpc"}
