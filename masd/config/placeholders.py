"""The placeholder secrets shipped with masd's example configuration: public, so refused.

``packaging/secrets-example/*.token`` (installed as
``/etc/masd/secrets-example/``) lets ``masd.toml.example`` be read as it is;
a configuration still pointing at one of them, or holding a copy of one,
would run masd with a secret anyone can read in masd's sources.
"""

from __future__ import annotations

from typing import Final

#: The content of each ``packaging/secrets-example/*.token`` (tests/test_placeholders.py
#: keeps the two the same).
PLACEHOLDER_SECRETS: Final = frozenset(
    {
        "example-6eh2jmEeyMP5yUPt3Zdb5AOsqFeG3DkTY95WgDiQ",  # admin.token
        "example-BPmD6l0nQH_paj_uRhTYHcedPqMLTLvtfmIdp3Gz",  # callback.token
        "example-ACaGrvalKUjRJ7xKVzdQktZk9szc_z16obMoGBmZ",  # crm.token
        "example-nxtnY5a9mNSKWLlNIASTJNz1Xd2VO0Sl64r_baRB",  # transfer.token
    }
)

#: How to make a secret of one's own (shown with the refusal).
MAKE_ONE: Final = "head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE"
