"""Renders chat-template cases with Python transformers, the reference for prep-chat.

Usage: python reference.py CASES.json RESULTS.json

CASES.json: {"date": [Y, M, D, h, m, s], "templates": {name: source},
             "cases": [{"template": name, "messages": [...], "tools": [...] | null,
                        "documents": [...] | null, "add_generation_prompt": bool,
                        "vars": {name: value}}]}

RESULTS.json: one entry per case, in order:
  {"text": str, "spans": [[start, end], ...]}  spans in UTF-8 byte offsets of text
  {"raised": message}                           the template called raise_exception
  {"error": "Type: message"}                    any other failure

Each case goes the way `tokenizer.apply_chat_template(messages, tools=...,
documents=..., add_generation_prompt=..., tokenize=False, **vars)` takes it
(the messages normalised by `_normalize_chat_messages`, then
`render_jinja_template`), with `return_assistant_tokens_mask=True` so that the
`{% generation %}` spans come back too. `strftime_now` formats the fixed date
of CASES.json instead of the clock. Exits 3 when transformers is missing, so
that the Rust test can say so and skip.
"""

import datetime
import json
import sys

try:
    import jinja2
    import transformers
    from transformers.utils import chat_template_utils as ctu
    from transformers.utils import logging as hf_logging
except ImportError as e:  # the Rust test skips, saying why
    print(f"transformers is not importable: {e}", file=sys.stderr)
    sys.exit(3)


class Raised(jinja2.exceptions.TemplateError):
    """What the template's raise_exception raises, told apart from other errors."""


def raise_exception(message):
    raise Raised(message)


def main():
    cases_path, results_path = sys.argv[1], sys.argv[2]
    with open(cases_path, encoding="utf-8") as f:
        spec = json.load(f)
    hf_logging.set_verbosity_error()  # no "template has no {% generation %}" warning
    now = datetime.datetime(*spec["date"])
    results = [render(spec["templates"][case["template"]], case, now) for case in spec["cases"]]
    with open(results_path, "w", encoding="utf-8") as f:
        json.dump({"transformers": transformers.__version__, "results": results}, f, ensure_ascii=False)


def render(source, case, now):
    try:
        # render_jinja_template compiles through this cache (an LRU of 128
        # templates), so the globals set here are the ones it renders with.
        compiled = ctu._compile_jinja_template(source)
        compiled.environment.globals["raise_exception"] = raise_exception
        compiled.environment.globals["strftime_now"] = now.strftime
        messages = ctu._normalize_chat_messages(case["messages"])
        rendered, indices = ctu.render_jinja_template(
            conversations=[messages],
            tools=case.get("tools"),
            documents=case.get("documents"),
            chat_template=source,
            return_assistant_tokens_mask=True,
            add_generation_prompt=case["add_generation_prompt"],
            **case["vars"],
        )
    except Raised as e:
        return {"raised": str(e.message)}
    except Exception as e:  # noqa: BLE001 - every other failure is one outcome
        return {"error": f"{type(e).__name__}: {e}"}
    text = rendered[0]
    spans = [[len(text[:s].encode()), len(text[:e].encode())] for s, e in indices[0]]
    return {"text": text, "spans": spans}


if __name__ == "__main__":
    main()
