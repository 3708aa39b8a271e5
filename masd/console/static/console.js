// masd console: follows the event feed live and asks before a drop. The pages read
// without it. Text from the feed is set with textContent only, never as HTML.
"use strict";

function cell(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  node.textContent = text;
  return node;
}

function kindClass(kind) {
  return "kind-" + kind.replace(/[^A-Za-z0-9]/g, "-");
}

function fileLink(cls, href, text) {
  const link = cell("a", cls, text);
  link.href = href;
  link.setAttribute("download", "");
  return link;
}

// The mail of a mail.in row, as masd.console.timeline.mail_html writes it.
function mailPart(mail) {
  const part = cell("div", "mail", "");
  if (mail.reply) part.append(cell("p", "reply", mail.reply));
  else part.append(cell("p", "reply empty", "(no words of the sender's own)"));
  const whole = cell("details", "whole", "");
  whole.append(cell("summary", "", mail.whole), cell("pre", "text", mail.text));
  part.append(whole);
  if (mail.attachments.length) {
    const list = cell("ul", "attachments", "");
    for (const file of mail.attachments) {
      const item = cell("li", "", "");
      item.append(fileLink("attachment", file.href, file.name), " ", cell("span", "about", file.about));
      list.append(item);
    }
    part.append(list);
  }
  const raw = cell("p", "raw", "");
  raw.append(fileLink("", mail.raw, "Raw message"), " ", cell("span", "about", mail.raw_about));
  part.append(raw);
  return part;
}

// The case's header counts what each new row adds (its tally).
function count(tally) {
  for (const [name, added] of Object.entries(tally)) {
    const node = document.querySelector('[data-count="' + CSS.escape(name) + '"]');
    if (node) node.textContent = String(Number(node.textContent) + added);
  }
}

function timelineRow(row) {
  const li = cell("li", "entry fresh " + kindClass(row.kind), "");
  li.dataset.seq = row.seq;
  li.append(cell("span", "seq", "#" + row.seq));
  const at = cell("time", "", row.at);
  at.setAttribute("datetime", row.at);
  li.append(at, cell("span", "kind", row.kind), cell("span", "what", row.what));
  if (row.state) {
    li.append(cell("span", "delivery state-" + row.state, row.state), cell("span", "more", row.more));
  }
  if (row.mail) li.append(mailPart(row.mail));
  return li;
}

function feedRow(event) {
  const row = event.row;
  const li = cell("li", "fresh " + kindClass(row.kind), "");
  const link = cell("a", "", event.case.address);
  link.href = "/console/cases/" + encodeURIComponent(event.case.key);
  li.append(cell("time", "", row.at), cell("span", "kind", row.kind), link, cell("span", "what", row.what));
  return li;
}

function follow(list) {
  const states = document.querySelectorAll(".live-state");
  const say = (text) => states.forEach((node) => { node.textContent = text; });
  const source = new EventSource(list.dataset.feed);
  source.onopen = () => say("live");
  source.onerror = () => say(source.readyState === EventSource.CLOSED ? "stopped" : "reconnecting…");
  source.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (list.classList.contains("timeline")) {
      if (list.querySelector('[data-seq="' + CSS.escape(event.row.seq) + '"]')) return;
      list.append(timelineRow(event.row));
      count(event.row.tally);
      const empty = document.getElementById("timeline-empty");
      if (empty) empty.remove();
    } else {
      const events = list.querySelector("ol.events");
      events.prepend(feedRow(event));
      while (events.children.length > 50) events.lastChild.remove();
    }
  };
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-feed]").forEach(follow);
  document.querySelectorAll("form[data-confirm]").forEach((form) => {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  });
});
