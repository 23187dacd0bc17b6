"""The reference for `prep tokenize --chat`: what a chat row becomes, computed
with Hugging Face transformers rather than with prep's code.

tests/python/test_chat.py imports this module and holds prep's records and
loss masks to it. The rule it implements is the one prep documents:

1. A row that is a JSON array is the messages; an object with `messages`
   holds OpenAI-style messages, with `conversations` ShareGPT turns, with
   `instruction` and `output` an Alpaca record.
2. OpenAI messages: `role` is one of ROLES; `content` given as a list of
   parts becomes the concatenation of the parts' text (`text`, else `value`),
   and a part whose `type` is not "text" makes the row bad; a tool call's
   `function.arguments` given as a string holding a JSON object becomes that
   object. Every other field is kept, in order.
3. The row's `tools` (a list, or a string holding one) goes to the template
   as `tools`; a row's `system` string (ShareGPT, Alpaca) becomes a first
   system message.
4. ShareGPT `from`: human/user -> user, gpt/assistant/model -> assistant,
   system -> system, function_call -> an assistant message with empty content
   and one tool call (the value is the JSON {"name", "arguments"}),
   observation/tool -> a tool message; anything else makes the row bad. A
   row's `chosen` turn is appended as the last turn.
5. Alpaca: [system], then each [question, answer] of `history` as a user and
   an assistant message, then the user message `instruction` (plus "\\n" and
   `input` when `input` is not empty) and the assistant message `output`.
6. The text is transformers' `apply_chat_template(messages, tools=tools,
   tokenize=False, add_generation_prompt=False, **variables)`, where the
   variables are bos_token and eos_token (and any --chat-var), and
   `strftime_now` reads DATE; the ids are the tokenizer's ids of that text
   with add_special_tokens=False, which must equal apply_chat_template's own.
7. The loss mask: with policy "assistant", the characters of the assistant
   replies are trainable. A template with {% generation %} blocks names them
   (transformers' generation indices); for any other, with P =
   render(messages[:i], add_generation_prompt=True), Q =
   render(messages[:i+1]) and W the whole text, reply i is W[a:b] where a is
   the length of the common prefix of P and Q and b that of Q and W; the row
   is bad ("unverifiable") when b <= a, when the reply's content (stripped;
   or, when it is empty, each of its tool calls' names) is not inside W[a:b],
   or when a reply starts before the one before it ends. "last" keeps the
   last reply only, "all" trains every token. A token (its offsets (s, e) in
   the text) is trainable when it begins inside a reply [a, b), overlaps
   it, and reaches past its end by whitespace at most: a <= s < b, a < e,
   and e <= b or text[b:e].isspace(). The prompt is never trainable: not a
   token that begins before the reply, whatever of it it reaches into (a
   header that is an added token with rstrip takes the reply's leading
   whitespace into its offsets, Phi-3's <|assistant|>; a run of newlines
   can begin in the prompt and end in the reply), nor one that runs past
   the reply's end into more than whitespace (the parting point b can lie
   inside the next turn's header where the text that closes a conversation
   and that header begin alike: Phi-3's <|endoftext|> and <|user|> part
   after "<|"). transformers' own assistant mask marks the tokens holding
   a generation block's first and last characters whatever else they hold;
   `Result.transformers_mask_differs` leaves out the tokens where the two
   rules part.
   A row with no trainable token is skipped, not bad.

A row prep must refuse is reported as a `BadRow`, whose `reason` is one of
REASONS. Python: target/venv (tools/requirements.txt pins transformers).

    from chat_reference import Reference
    ref = Reference(template_text, "tokenizer.json", {"bos_token": "<s>", "eos_token": "</s>"})
    result = ref.row(json.loads(line))          # .kept, .ids, .mask, .reason, .text
"""

from __future__ import annotations

import io
import json
import re
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast
from transformers.utils import chat_template_utils

ROLES = ("system", "developer", "user", "assistant", "tool", "ipython")
"""The roles a message may have; any other makes the row bad."""

POLICIES = ("assistant", "last", "all")
"""The values of --loss-mask."""

DATE = datetime(2026, 1, 1)
"""What `strftime_now` reads: prep runs with --chat-date 2026-01-01."""

REASONS = ("shape", "template", "render", "unverifiable")
"""Why a row is bad: it is no conversation (shape); the template refused it
with raise_exception (template); rendering it failed otherwise, such as an
undefined attribute used or adding a string to a mapping (render); its
replies cannot be told apart from the rest of the text (unverifiable)."""

_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


class BadRow(Exception):
    """A row prep must refuse: exit 2 without --skip-bad, skipped and counted with it."""

    def __init__(self, reason: str, message: str):
        assert reason in REASONS, reason
        self.reason = reason
        super().__init__(f"{reason}: {message}")


@dataclass
class Result:
    """What one row becomes: kept (ids and mask), skipped (no trainable token) or bad."""

    status: str  # "kept", "skipped" or "bad"
    ids: list[int] = field(default_factory=list)
    mask: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint8))
    text: str = ""
    offsets: list[tuple[int, int]] = field(default_factory=list)
    reason: str | None = None  # for "bad", one of REASONS
    message: str = ""
    # Where transformers' own assistant mask (return_assistant_tokens_mask)
    # differs from `mask`: token indices. Generation templates only.
    transformers_mask_differs: list[int] = field(default_factory=list)

    @property
    def kept(self) -> bool:
        return self.status == "kept"


# --- Rows into conversations -------------------------------------------------------------------

def _text_of_parts(parts: list) -> str:
    text = []
    for i, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise BadRow("shape", f"content part {i} is of type {kind!r}, not text")
        piece = part["text"] if "text" in part else part.get("value")
        if not isinstance(piece, str):
            raise BadRow("shape", f"content part {i} has no text")
        text.append(piece)
    return "".join(text)


def _tool_calls(calls: list) -> list:
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                function = {k: (parsed if k == "arguments" else v) for k, v in function.items()}
                call = {k: (function if k == "function" else v) for k, v in call.items()}
        out.append(call)
    return out


def _openai_message(m: Any, i: int) -> dict:
    if not isinstance(m, dict):
        raise BadRow("shape", f"message {i} is not an object")
    role = m.get("role")
    if role not in ROLES:
        raise BadRow("shape", f"message {i}: unknown role {role!r}")
    out = {}
    for key, value in m.items():
        if key == "content" and isinstance(value, list):
            value = _text_of_parts(value)
        elif key == "tool_calls" and isinstance(value, list):
            value = _tool_calls(value)
        out[key] = value
    return out


_FROM = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "model": "assistant", "system": "system", "observation": "tool", "tool": "tool"}


def _sharegpt_turn(t: Any, i: int) -> dict:
    if not isinstance(t, dict) or not isinstance(t.get("from"), str):
        raise BadRow("shape", f"turn {i} has no \"from\"")
    value = t.get("value")
    if not isinstance(value, str):
        raise BadRow("shape", f"turn {i}'s value is not a string")
    if t["from"] == "function_call":
        try:
            call = json.loads(value)
        except ValueError:
            raise BadRow("shape", f"turn {i}: a function_call's value is not JSON") from None
        if not isinstance(call, dict) or "name" not in call:
            raise BadRow("shape", f"turn {i}: a function_call's value has no \"name\"")
        function = {"name": call["name"], "arguments": call.get("arguments", {})}
        return {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function", "function": function}]}
    if t["from"] not in _FROM:
        raise BadRow("shape", f"turn {i}: unknown \"from\" {t['from']!r}")
    return {"role": _FROM[t["from"]], "content": value}


def _alpaca(row: dict) -> list[dict]:
    def text(name: str) -> str | None:
        value = row.get(name)
        if value is not None and not isinstance(value, str):
            raise BadRow("shape", f"field {name!r} is not a string")
        return value

    messages = []
    history = row.get("history")
    if history is not None:
        if not isinstance(history, list):
            raise BadRow("shape", "\"history\" is not a list")
        for i, pair in enumerate(history):
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(s, str) for s in pair)):
                raise BadRow("shape", f"history entry {i} is not a [question, answer] pair")
            messages += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    instruction, extra, output = text("instruction"), text("input"), text("output")
    if instruction is None or output is None:
        raise BadRow("shape", "an Alpaca row needs \"instruction\" and \"output\"")
    user = f"{instruction}\n{extra}" if extra else instruction
    return messages + [{"role": "user", "content": user}, {"role": "assistant", "content": output}]


def conversation(row: Any) -> tuple[list[dict], list | None]:
    """(messages, tools) of one parsed JSON row, by rules 1-5; BadRow("shape") if it is none."""
    if isinstance(row, list):
        shape, messages = "messages", row
    elif not isinstance(row, dict):
        raise BadRow("shape", "a row is neither an object nor a list of messages")
    elif "messages" in row:
        shape, messages = "messages", row["messages"]
    elif "conversations" in row:
        shape, messages = "sharegpt", row["conversations"]
    elif "instruction" in row and "output" in row:
        shape, messages = "alpaca", None
    else:
        raise BadRow("shape", f"no conversation in a row with fields {list(row)}")

    out = []
    if shape != "messages" and row.get("system") is not None:
        if not isinstance(row["system"], str):
            raise BadRow("shape", "field \"system\" is not a string")
        out.append({"role": "system", "content": row["system"]})
    if shape == "alpaca":
        out += _alpaca(row)
    else:
        if not isinstance(messages, list):
            raise BadRow("shape", f"the {shape} list is not a list")
        if shape == "messages":
            out += [_openai_message(m, i) for i, m in enumerate(messages)]
        else:
            turns = messages + ([row["chosen"]] if "chosen" in row else [])
            out += [_sharegpt_turn(t, i) for i, t in enumerate(turns)]
    if not out:
        raise BadRow("shape", "the conversation has no messages")

    tools = row.get("tools") if isinstance(row, dict) else None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError:
            raise BadRow("shape", "field \"tools\" is a string but not JSON") from None
    if tools is not None and not isinstance(tools, list):
        raise BadRow("shape", "field \"tools\" is not a list")
    return out, tools


# --- Conversations into text, ids and masks ---------------------------------------------------

def read_tokenizer(path: Path | str) -> Tokenizer:
    """A tokenizer.json, or one compressed with zstd (.zst), as prep reads both."""
    data = Path(path).read_bytes()
    if str(path).endswith(".zst"):
        import zstandard

        data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
    tok = Tokenizer.from_str(data.decode("utf-8"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def _fixed_clock(template: str) -> None:
    """Make the compiled template's `strftime_now` read DATE.

    transformers compiles each template once (an lru_cache keyed by its
    text) and looks `strftime_now` up in that environment's globals at
    render time, so replacing it there fixes the date for every render.
    """
    env = chat_template_utils._compile_jinja_template(template).environment
    env.globals["strftime_now"] = lambda fmt: DATE.strftime(fmt)


def _common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of a and b, in characters."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _tool_call_names(message: dict) -> list[str]:
    """The names of a message's tool calls (function.name, or name)."""
    names = []
    for call in message.get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else call
        if isinstance(function.get("name"), str):
            names.append(function["name"])
    return names


def _overlap_mask(offsets: np.ndarray, spans: list[tuple[int, int]], text: str) -> np.ndarray:
    """1 for each token (s, e) with a <= s < b, a < e, and e <= b or text[b:e].isspace()
    for some span [a, b), else 0 (rule 7)."""
    mask = np.zeros(len(offsets), dtype=bool)
    if len(offsets):
        s, e = offsets[:, 0], offsets[:, 1]
        for a, b in spans:
            inside = (a <= s) & (s < b) & (a < e)
            trained = inside & (e <= b)
            for k in np.flatnonzero(inside & (e > b)):  # few: those running past the end
                trained[k] = text[b:int(e[k])].isspace()
            mask |= trained
    return mask.astype(np.uint8)


def _crossing(offsets: np.ndarray, spans: list[tuple[int, int]], text: str) -> np.ndarray:
    """Whether each token (s, e) crosses a span [a, b)'s start (s < a < e) or its end
    into more than whitespace (s < b < e, text[b:e] not all space): where rule 7 and
    transformers' generation mask part."""
    out = np.zeros(len(offsets), dtype=bool)
    if len(offsets):
        s, e = offsets[:, 0], offsets[:, 1]
        for a, b in spans:
            out |= (s < a) & (a < e)
            for k in np.flatnonzero((s < b) & (b < e)):
                out[k] |= not text[b:int(e[k])].isspace()
    return out


class Reference:
    """One template and one tokenizer: `row(json_row, policy)` gives a `Result`.

    `template` is the Jinja text; `tokenizer` a tokenizer.json (or .json.zst)
    path or a `tokenizers.Tokenizer`; `variables` what the template sees
    beside messages, tools and add_generation_prompt (bos_token, eos_token,
    and any --chat-var).
    """

    def __init__(self, template: str, tokenizer: Path | str | Tokenizer, variables: dict | None = None):
        self.template = template
        self.variables = dict(variables or {})
        # No bos/eos given to the wrapper: it would add any it does not find
        # to the vocabulary. They reach the template as variables instead.
        if isinstance(tokenizer, Tokenizer):
            self.hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
        elif str(tokenizer).endswith(".zst"):
            with tempfile.TemporaryDirectory() as tmp:
                read_tokenizer(tokenizer).save(str(Path(tmp) / "tokenizer.json"))
                self.hf = PreTrainedTokenizerFast(tokenizer_file=str(Path(tmp) / "tokenizer.json"))
        else:
            # From the file rather than a Tokenizer object, which the wrapper
            # would deep-copy (seconds for a large vocabulary).
            self.hf = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer))
        self.hf.backend_tokenizer.no_truncation()
        self.hf.backend_tokenizer.no_padding()
        self.generation = bool(_GENERATION.search(template))
        _fixed_clock(template)

    # Rendering -------------------------------------------------------------

    def render(self, messages: list[dict], tools: list | None, add_generation_prompt: bool) -> str:
        """apply_chat_template(tokenize=False); an empty conversation, which
        apply_chat_template refuses, renders through the same Jinja call."""
        if not messages:
            rendered, _ = chat_template_utils.render_jinja_template(
                conversations=[[]], tools=tools, chat_template=self.template,
                add_generation_prompt=add_generation_prompt,
                **{**self.hf.special_tokens_map, **self.variables})
            return rendered[0]
        return self.hf.apply_chat_template(
            messages, tools=tools, chat_template=self.template, tokenize=False,
            add_generation_prompt=add_generation_prompt, **self.variables)

    def _render_row(self, messages: list[dict], tools: list | None) -> str:
        try:
            return self.render(messages, tools, False)
        except jinja2.TemplateError as e:
            if type(e) is jinja2.TemplateError:  # raise_exception raises exactly this type
                raise BadRow("template", str(e)) from None
            raise BadRow("render", f"{type(e).__name__}: {e}") from None
        except Exception as e:  # noqa: BLE001: any other failure of the template is a bad row too
            raise BadRow("render", f"{type(e).__name__}: {e}") from None

    def _generation_spans(self, messages: list[dict], tools: list | None, text: str) -> list[tuple[int, int]]:
        normalized = chat_template_utils._normalize_chat_messages(messages)
        rendered, indices = chat_template_utils.render_jinja_template(
            conversations=[normalized], tools=tools, chat_template=self.template,
            return_assistant_tokens_mask=True, add_generation_prompt=False,
            **{**self.hf.special_tokens_map, **self.variables})
        assert rendered[0] == text, "the tracked render differs from apply_chat_template's"
        return [tuple(span) for span in indices[0]]

    def _prefix_spans(self, messages: list[dict], tools: list | None, text: str) -> list[tuple[int, int]]:
        spans = []
        for i, m in enumerate(messages):
            if m.get("role") != "assistant":
                continue
            try:
                p = self.render(messages[:i], tools, True)
                q = self.render(messages[:i + 1], tools, False)
            except Exception as e:  # noqa: BLE001
                raise BadRow("unverifiable", f"message {i}: rendering a prefix fails: {e}") from None
            start, end = _common_prefix(p, q), _common_prefix(q, text)
            if end <= start:
                raise BadRow("unverifiable", f"message {i}: the text through the reply does not "
                                             f"continue past the reply's prompt")
            content = m.get("content")
            content = content.strip() if isinstance(content, str) else ""
            needles = [content] if content else _tool_call_names(m)
            if any(n not in text[start:end] for n in needles):
                raise BadRow("unverifiable", f"message {i}: the reply's text is not inside its span")
            if spans and spans[-1][1] > start:
                raise BadRow("unverifiable", f"message {i}: the reply does not follow the one before")
            spans.append((start, end))
        return spans

    # One row ---------------------------------------------------------------

    def row(self, row: Any, policy: str = "assistant") -> Result:
        """What `row` (one parsed JSON row) becomes under --loss-mask `policy`."""
        assert policy in POLICIES, policy
        try:
            return self._row(row, policy)
        except BadRow as e:
            return Result("bad", reason=e.reason, message=str(e))

    def _row(self, row: Any, policy: str) -> Result:
        messages, tools = conversation(row)
        text = self._render_row(messages, tools)
        spans = []
        if policy != "all":
            if self.generation:
                spans = self._generation_spans(messages, tools, text)
            else:
                spans = self._prefix_spans(messages, tools, text)
            if policy == "last":
                spans = spans[-1:]

        enc = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        if policy == "all":
            mask = np.ones(len(ids), dtype=np.uint8)
        else:
            mask = _overlap_mask(offsets, spans, text)

        # The same through apply_chat_template(tokenize=True), and for a
        # template with generation blocks, transformers' own mask.
        out = self.hf.apply_chat_template(
            messages, tools=tools, chat_template=self.template, tokenize=True, return_dict=True,
            return_assistant_tokens_mask=self.generation, add_generation_prompt=False,
            **self.variables)
        assert list(out["input_ids"]) == ids, "apply_chat_template's ids differ from the text's"
        differs = []
        if self.generation and policy == "assistant":
            theirs = np.asarray(out["assistant_masks"], dtype=np.uint8)
            # transformers marks the tokens holding a block's first and
            # last characters, prompt and all (rule 7 trains neither).
            crossing = _crossing(offsets, spans, text)
            theirs[crossing] = mask[crossing]
            differs = np.flatnonzero(theirs != mask).tolist()

        result = Result("kept", ids=ids, mask=mask, text=text, offsets=[tuple(o) for o in offsets.tolist()],
                        transformers_mask_differs=differs)
        if not mask.any():
            result.status = "skipped"
        return result


def template_text(path: Path | str) -> str:
    """The Jinja text of a template file, or of a tokenizer_config.json or
    chat_template.json holding it as "chat_template" (a string)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        template = json.loads(text)["chat_template"]
        assert isinstance(template, str), f"{path}: a list of named templates"
        return template
    return text


def config_variables(path: Path | str) -> dict:
    """bos_token and eos_token of a tokenizer_config.json, those that are strings."""
    config = json.loads(Path(path).read_text(encoding="utf-8"))
    out = {}
    for key in ("bos_token", "eos_token"):
        value = config.get(key)
        if isinstance(value, dict):  # an AddedToken written out
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out
