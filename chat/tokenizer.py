"""A model's own tokenizer and chat template (its Hugging Face files), applied as SGLang does.

SGLang turns a chat request into token ids with ``tokenizer.apply_chat_template(messages,
tokenize=True, add_generation_prompt=True)``: the chat template (Jinja, from
``chat_template.jinja`` or ``tokenizer_config.json``) rendered in a sandbox with
``trim_blocks`` and ``lstrip_blocks``, the special tokens' text (``bos_token``, ``eos_token``…)
as variables, then the text encoded by ``tokenizer.json`` **without** added special tokens (the
template writes them). A plain prompt (``/v1/completions``, ``/generate`` text) is encoded
**with** them (Llama 3 puts ``<|begin_of_text|>`` first). Message content given as a list of text
parts is joined with spaces unless the template iterates over ``message['content']`` itself
(SGLang's ``string`` / ``openai`` content formats); keys whose value is null are dropped.

The picker (filters/plugins/picker) renders prompts with this in the filter server and tokenizes them,
piece by piece, in its mapper; the emulator uses it with ``--tokenizer-path`` so its KV events
carry the model's token ids, as a real SGLang server's do.

**Resuming mid-prompt** (:meth:`HfChatTokenizer.stable`): the mapper tokenizes a long prompt a
checkpoint at a time and must get exactly the ids the whole prompt would give. A byte-level BPE
tokenizer first cuts out added tokens, then splits the text into pre-tokens (a regex: words,
digit runs, punctuation, whitespace), and merges within each pre-token only. A regex of this kind
looks at most one character ahead, so in a piece of text every pre-token but the last two is cut
exactly as in any longer text that starts with that piece; their ids are final, and the next piece
resumes at the first byte not covered. A trailing partial added token (``<|eot_`` of
``<|eot_id|>``) is left to the next piece. The bytes of the ids kept are checked against the text
(a normalizer such as NFC could change them): on a mismatch nothing is kept, so the caller learns
less, never something wrong. Only byte-level tokenizers (Llama 3, Qwen, DeepSeek, GPT-2 family)
are accepted: SentencePiece-style ones (``▁`` for spaces) change the text before splitting.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from wire.jsontypes import JsonObject, JsonValue

if TYPE_CHECKING:
    from jinja2 import Template, nodes
    from jinja2.parser import Parser
    from tokenizers import Tokenizer

__all__ = [
    "ChatTemplateError",
    "HfChatTokenizer",
    "TokenizerFilesError",
    "byte_decoder",
    "sglang_tools",
]

_SPECIAL_KEYS = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)  # fmt: skip


class TokenizerFilesError(ValueError):
    """A model directory whose tokenizer files are missing, unreadable or unsupported."""


class ChatTemplateError(ValueError):
    """A request the chat template cannot render (the template raised, or the messages are not a
    list of objects)."""


def byte_decoder() -> dict[str, int]:
    """The byte-level alphabet: the character each byte is written as in a byte-level BPE
    vocabulary (printable Latin-1 as itself, the other bytes as U+0100 on), inverted."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(0x100 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def _token_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _has_byte_level(node: object) -> bool:
    if not isinstance(node, Mapping):
        return False
    if node.get("type") == "ByteLevel":
        return True
    return any(_has_byte_level(n) for n in node.get("pretokenizers") or ())


class HfChatTokenizer:
    """One model's tokenizer and chat template; :meth:`load` reads them from a directory."""

    def __init__(
        self, path: str, tokenizer: Tokenizer, template: str | None, config: Mapping[str, object]
    ) -> None:
        self.path = path
        self.tokenizer = tokenizer
        self.special: dict[str, str | list[str]] = {}  # the template's token variables
        for key in _SPECIAL_KEYS:
            text = _token_text(config.get(key))
            if text is not None:
                self.special[key] = text
        extra = config.get("additional_special_tokens")
        if isinstance(extra, list):
            self.special["additional_special_tokens"] = [
                t for t in (_token_text(v) for v in extra) if t is not None
            ]
        self._template = _compile(template, path) if template is not None else None
        self.content_as_list = template is not None and _iterates_content(template)
        decoder = byte_decoder()
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self._bytes: list[bytes | None] = [None] * (max(vocab.values(), default=-1) + 1)
        added = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
        for text, tid in vocab.items():
            if text in added:
                self._bytes[tid] = text.encode("utf-8")
            elif all(c in decoder for c in text):
                self._bytes[tid] = bytes(decoder[c] for c in text)
        self._partials = frozenset(a[:k] for a in added for k in range(1, len(a)))
        self._longest = max((len(a) for a in added), default=1)
        # the special tokens the tokenizer puts before a plain prompt, as text
        bare = tokenizer.encode("x", add_special_tokens=False).ids
        full = tokenizer.encode("x", add_special_tokens=True).ids
        lead = full[: len(full) - len(bare)] if full[len(full) - len(bare) :] == bare else []
        self.lead = "".join(tokenizer.id_to_token(t) or "" for t in lead)

    @classmethod
    def load(cls, directory: str | Path) -> HfChatTokenizer:
        """The files of a model directory (what SGLang's ``--tokenizer-path`` names):
        ``tokenizer.json``, and ``tokenizer_config.json`` / ``chat_template.jinja`` if there.
        Raises :class:`TokenizerFilesError` with the file and the reason."""
        try:
            import jinja2  # noqa: F401  (the chat template, compiled below)
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - dependencies of the tokenizer extra
            raise TokenizerFilesError(
                "a model tokenizer needs the 'tokenizers' and 'jinja2' packages "
                "(pip install 'tokenweir[tokenizer]')"
            ) from exc
        root = Path(directory)
        path = root / "tokenizer.json"
        try:
            spec: JsonValue = json.loads(path.read_text(encoding="utf-8"))
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # OSError, ValueError, and the tokenizers library's own
            raise TokenizerFilesError(f"{path}: cannot load the tokenizer: {exc}") from exc
        if not isinstance(spec, dict) or not _has_byte_level(spec.get("pre_tokenizer")):
            raise TokenizerFilesError(
                f"{path}: pre_tokenizer is not byte-level; only byte-level BPE tokenizers "
                "(Llama 3, Qwen, DeepSeek, GPT-2 family) can be followed piece by piece"
            )
        config: JsonObject = {}
        cfg_path = root / "tokenizer_config.json"
        if cfg_path.exists():
            try:
                loaded: JsonValue = json.loads(cfg_path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise TokenizerFilesError(f"{cfg_path}: {exc}") from exc
            if not isinstance(loaded, dict):
                raise TokenizerFilesError(f"{cfg_path}: must hold a JSON object")
            config = loaded
        template = _template_text(root, config)
        return cls(str(root), tokenizer, template, config)

    # ---- rendering ---------------------------------------------------------------------------
    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def render_chat(
        self,
        messages: object,
        *,
        tools: Sequence[Mapping[str, object]] | None = None,
        extra: Mapping[str, object] | None = None,
    ) -> str:
        """The rendered prompt of OpenAI chat ``messages`` with the generation prompt at the end.
        Raises :class:`ChatTemplateError`."""
        if self._template is None:
            raise ChatTemplateError(f"{self.path}: the model has no chat template")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ChatTemplateError("messages must be a list of objects")
        msgs = [self._message(m) for m in messages]
        kwargs = {**self.special, **(extra or {})}
        try:
            text = self._template.render(
                messages=msgs, tools=tools, documents=None, add_generation_prompt=True, **kwargs
            )
        except Exception as exc:  # jinja2's errors, and raise_exception() in the template
            raise ChatTemplateError(f"the chat template failed: {exc}") from exc
        return str(text)

    def render_request(self, body: Mapping[str, object]) -> str:
        """:meth:`render_chat` of a chat completion body as SGLang renders it: its tools as
        :func:`sglang_tools` gives them and its ``chat_template_kwargs``."""
        extra = body.get("chat_template_kwargs")
        return self.render_chat(
            body.get("messages"),
            tools=sglang_tools(body),
            extra=extra if isinstance(extra, dict) else None,
        )

    def _message(self, msg: Mapping[str, object]) -> dict[str, object]:
        out = {k: v for k, v in msg.items() if v is not None}
        content = out.get("content")
        if isinstance(content, list) and not self.content_as_list:
            out["content"] = " ".join(
                str(p.get("text"))
                for p in content
                if isinstance(p, dict) and p.get("type") == "text"
            )
        return out

    def plain_prompt(self, text: str) -> str:
        """A plain prompt's text with the special tokens its encoding starts with written out,
        so that ``encode(plain_prompt(t)) == tokenizer.encode(t, add_special_tokens=True)``."""
        return self.lead + text

    # ---- ids ---------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Ids of rendered text (added special tokens not added again). Raises
        :class:`ChatTemplateError` for text the tokenizer cannot take (a lone surrogate)."""
        try:
            return list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        except (TypeError, ValueError) as exc:
            raise ChatTemplateError(f"the tokenizer cannot encode this text: {exc}") from exc

    def stable(self, data: bytes) -> tuple[list[int], int]:
        """The ids of ``data`` (UTF-8, the start of the rest of a prompt) that no later text can
        change, and how many bytes of ``data`` they cover (see the module docstring)."""
        text = data.decode("utf-8", "ignore")  # a character cut at the end: left for later
        for k in range(min(self._longest - 1, len(text)), 0, -1):
            if text[-k:] in self._partials:
                text = text[:-k]
                break
        enc = self.tokenizer.encode(text, add_special_tokens=False)
        words, ids = enc.word_ids, enc.ids
        # keep every pre-token but the last two (an added token is one of its own)
        keep, groups = 0, 0
        for i in range(len(ids) - 1, -1, -1):
            if i == len(ids) - 1 or words[i] is None or words[i] != words[i + 1]:
                groups += 1
                if groups == 3:  # token i ends the third pre-token from the end
                    keep = i + 1
                    break
        pieces = [self._bytes[t] if t < len(self._bytes) else None for t in ids[:keep]]
        if any(p is None for p in pieces):
            return [], 0
        covered = b"".join(p for p in pieces if p is not None)
        if not data.startswith(covered):  # a normalizer changed the text: learn nothing
            return [], 0
        return list(ids[:keep]), len(covered)


def sglang_tools(body: Mapping[str, object]) -> list[dict[str, object]] | None:
    """The ``tools`` SGLang hands the chat template: none with ``tool_choice: none``; with a named
    ``tool_choice`` only that function; each function as its ``Function`` model dumps it
    (``description``, ``name``, ``parameters``, ``strict`` in that order, ``strict`` false by
    default)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if not isinstance(tools, list) or not tools or choice == "none":
        return None
    only = None
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        only = choice["function"].get("name")
    out = []
    for tool in tools:
        f = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(f, dict) or (only is not None and f.get("name") != only):
            continue
        out.append({
            "description": f.get("description"), "name": f.get("name"),
            "parameters": f.get("parameters"), "strict": bool(f.get("strict", False)),
        })  # fmt: skip
    return out


def _template_text(root: Path, config: Mapping[str, object]) -> str | None:
    jinja = root / "chat_template.jinja"
    if jinja.exists():
        try:
            return jinja.read_text(encoding="utf-8")
        except OSError as exc:
            raise TokenizerFilesError(f"{jinja}: {exc}") from exc
    value = config.get("chat_template")
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # named templates: the default one
        for item in value:
            if isinstance(item, dict) and item.get("name") == "default":
                text = item.get("template")
                return text if isinstance(text, str) else None
    return None


def _compile(template: str, path: str) -> Template:
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generation(Extension):  # transformers' {% generation %} … {% endgeneration %}
        tags = {"generation"}  # noqa: RUF012 (jinja2 declares it a set)

        def parse(self, parser: Parser) -> nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    def raise_exception(message: str) -> None:
        raise ChatTemplateError(message)

    def tojson(
        x: object, ensure_ascii: bool = False, indent: int | str | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:  # fmt: skip
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateError as exc:
        raise TokenizerFilesError(f"{path}: the chat template does not compile: {exc}") from exc


def _iterates_content(template: str) -> bool:
    """Whether the template loops over a message's content (SGLang's ``openai`` format)."""
    import jinja2
    from jinja2 import nodes

    try:
        ast = jinja2.Environment().parse(template)
    except jinja2.TemplateError:
        return False
    for loop in ast.find_all(nodes.For):
        it: nodes.Node | None = loop.iter
        while isinstance(it, nodes.Filter | nodes.Getattr | nodes.Getitem) and not _content_of(it):
            it = it.node
        if _content_of(it):
            return True
    return False


def _content_of(node: nodes.Node | None) -> bool:
    from jinja2 import nodes

    if isinstance(node, nodes.Getattr):
        named = node.attr == "content"
    elif isinstance(node, nodes.Getitem):
        named = isinstance(node.arg, nodes.Const) and node.arg.value == "content"
    else:
        return False
    target = node.node
    return named and isinstance(target, nodes.Name) and target.name in ("message", "msg", "m")
