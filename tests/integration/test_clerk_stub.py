"""The Clerk stub as a process of its own, driven over its control API, the way a soak run starts it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

AUTH = {"Authorization": "Bearer sk_test_x"}


@pytest.fixture
def stub_process() -> Iterator[str]:
    command = [sys.executable, "-m", "app.testing.clerk_stub", "--port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            yield proc.stdout.readline().strip()
        finally:
            proc.terminate()


def test_objects_put_over_http_are_listed_and_a_removed_one_is_not(stub_process: str) -> None:
    with httpx.Client(base_url=stub_process) as http:
        http.post("/_stub/put_user", json={"id": "user_ada", "email": "ada@example.org", "updated_at": 1000})
        http.post("/_stub/put_user", json={"id": "user_gone", "updated_at": 1000})
        http.post("/_stub/put_organization", json={"id": "org_1", "name": "Engines", "updated_at": 2000})
        membership = {"id": "orgmem_1", "organization": "org_1", "user": "user_ada", "updated_at": 3000}
        http.post("/_stub/put_membership", json=membership).raise_for_status()
        http.post("/_stub/remove", json={"kind": "user", "id": "user_gone"}).raise_for_status()

        users = http.get("/v1/users", headers=AUTH).json()
        organizations = http.get("/v1/organizations", headers=AUTH).json()
        memberships = http.get("/v1/organization_memberships", headers=AUTH).json()
        logged = http.get("/_stub/requests").json()["requests"]

    assert [(u["id"], u["email_addresses"][0]["email_address"], u["updated_at"]) for u in users] == [
        ("user_ada", "ada@example.org", 1000)
    ]
    assert [(o["id"], o["name"]) for o in organizations["data"]] == [("org_1", "Engines")]
    member = memberships["data"][0]
    assert (member["organization"]["id"], member["public_user_data"]["user_id"]) == ("org_1", "user_ada")
    assert logged == [["GET", "/v1/users"], ["GET", "/v1/organizations"], ["GET", "/v1/organization_memberships"]]


def test_a_bad_command_is_a_400_that_names_it_and_reset_empties_the_stub(stub_process: str) -> None:
    with httpx.Client(base_url=stub_process) as http:
        http.post("/_stub/put_user", json={"id": "user_1"})
        bad = http.post("/_stub/remove", json={"kind": "planet", "id": "x"})
        http.post("/_stub/reset", json={}).raise_for_status()
        users = http.get("/v1/users", headers=AUTH).json()

    assert bad.status_code == 400 and "/_stub/remove" in bad.text
    assert users == []
