"""What the read side and the event feed show, as JSON (docs/protocol.md §16)."""
