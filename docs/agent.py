"""Answer new mail on masd's slave-role cases over MCP (docs/agents.md).

    python docs/agent.py --config /etc/masd/masd.toml --token-file /etc/masd/secrets/crm.token
"""

import argparse
import asyncio
import json

from mcp import ClientSession, StdioServerParameters, stdio_client


def draft(event: dict) -> str:
    """The answer to a mail: where a language model goes.  This one writes a template."""
    asked = (event.get("reply_text") or event.get("text") or "").strip()
    first = asked.splitlines()[0] if asked else "your message"
    return f"Hello,\n\nThank you for writing about: {first}\nWe are on it.\n\nThe support team\n"


async def call(client: ClientSession, tool: str, **args: object) -> dict:
    result = await client.call_tool(tool, args)
    answer = json.loads(result.content[0].text)
    if result.is_error:  # a named refusal: {"ok": false, "error": CODE, "detail": ...}
        raise RuntimeError(f"{tool}: {answer['error']}: {answer['detail']}")
    return answer


async def work(masd: str, config: str, token_file: str, answers: int) -> None:
    args = ["mcp", "--config", config, "--token-file", token_file]
    server = StdioServerParameters(command=masd, args=args)
    async with stdio_client(server) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        after = {}  # the cursor: keep it across restarts in a real agent
        while answers > 0:
            page = await call(client, "wait_events", **after, wait=30)
            after = {"after": page["next"]}
            for event in page["events"]:
                entry = event["entry"]
                if entry["kind"] != "mail.in" or answers == 0:
                    continue
                ref = entry["message_ref"]
                mail = await call(client, "read_message", message_ref=ref)
                answer = draft(mail["message"]["event"])
                reply = {"case": event["case"], "in_reply_to": ref, "body": answer}
                sent = await call(client, "send_mail", **reply)
                print(f"answered {ref} on {event['case']['key']}: {sent}")
                answers -= 1


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description="Answer new mail on masd's cases over MCP.")
    cli.add_argument("--masd", default="masd", help="the masd command (default: masd)")
    cli.add_argument("--config", required=True)
    cli.add_argument("--token-file", required=True)
    cli.add_argument("--answers", type=int, default=1, help="stop after this many answers")
    opts = cli.parse_args()
    asyncio.run(work(opts.masd, opts.config, opts.token_file, opts.answers))
