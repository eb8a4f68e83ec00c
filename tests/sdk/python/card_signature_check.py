"""The official Python SDK (a2a-sdk 1.3.0, `signing` extra) verifies a2ad's signed cards.

Run by tests/sdk/run against an a2ad whose `[cards.signing]` key is an Ed25519 key made
for the run: argv = base URL, API key, the public key's PEM file. The card resolver gets the
SDK's own verifier (`create_signature_verifier`); a tampered card must fail it.
"""

import asyncio
import sys

import httpx

from a2a.client import A2ACardResolver
from a2a.utils.signing import InvalidSignaturesError, create_signature_verifier

BASE, KEY, PUBLIC_PEM = sys.argv[1], sys.argv[2], sys.argv[3]
CHECKS = []


def check(name, ok, detail=""):
    CHECKS.append(name)
    if not ok:
        print(f"FAIL {name}: {detail}")
        sys.exit(1)
    print(f"ok   {name}")


async def main():
    with open(PUBLIC_PEM, "rb") as f:
        public = f.read()
    seen = []

    def key_provider(kid, jku):
        seen.append(kid)
        return public

    verify = create_signature_verifier(key_provider, ["EdDSA", "ES256"])
    async with httpx.AsyncClient(timeout=30.0) as http:
        resolver = A2ACardResolver(http, BASE)
        for version in ("1.0", "0.3"):
            card = await resolver.get_agent_card(
                http_kwargs={"headers": {"A2A-Version": version}},
                signature_verifier=verify,
            )
            check(f"[card {version}] the SDK's verifier accepts the signed card", len(card.signatures) >= 1)
        check("[card] the signature names its key", seen and seen[-1] == "sdk-card-key", seen)
        card.name = card.name + " (tampered)"
        try:
            verify(card)
            check("[card] a tampered card fails the SDK's verifier", False, "it verified")
        except InvalidSignaturesError:
            check("[card] a tampered card fails the SDK's verifier", True)
        card = await resolver.get_agent_card(signature_verifier=verify)
        card.supported_interfaces[0].url = "https://evil.example.com/a2a"
        try:
            verify(card)
            check("[card] a card pointing elsewhere fails the SDK's verifier", False, "it verified")
        except InvalidSignaturesError:
            check("[card] a card pointing elsewhere fails the SDK's verifier", True)
    print(f"python a2a-sdk card signatures: {len(CHECKS)} checks passed")


asyncio.run(main())
