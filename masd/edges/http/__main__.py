"""``python -m masd.edges.http``: print the listener's OpenAPI document
(:mod:`masd.edges.http.openapi`), the bytes ``docs/openapi.json`` holds."""

from masd.edges.http.openapi import main

main()
