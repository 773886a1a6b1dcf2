"""The flags of `jaxtpu serve` and `jaxtpu feedback` (framework-free), declared as every
command's are (`jaxtpu.core.flags.fields._c`) and registered in `jaxtpu.core.flags.commands`."""

from __future__ import annotations

from dataclasses import dataclass

from jaxtpu.core.flags.fields import _c, _no_calibration
from jaxtpu.core.flags.schema import Bounds, ScoringConfig


@dataclass(frozen=True)
class ServeFlags:
    workdir: list[str] | None = _c(
        None,
        "Run directory (its best model) to serve; several are served side by side, each "
        "answering its own attributes (an attribute two runs answer is refused).",
        nargs="+",
        required=True,
        one_of="source",
    )
    model_dir: str | None = _c(
        None,
        "Instead of a run: an export to serve (a jaxtpu export with head.safetensors, or a "
        "*ForSequenceClassification directory: `jaxtpu export` of a --head hf run), in fp32.",
        one_of="source",
    )
    onnx: str | None = _c(
        None,
        "Instead of a run: an ONNX export (`jaxtpu export --format onnx [--quantize int8]`) "
        "to serve on onnxruntime, on the CPU: its directory (model.onnx, fp32) or one of its "
        "graphs (DIR/model_int8.onnx). Scored as the run is: its text format, length buckets "
        "and calibration, from the export's jaxtpu_onnx.json.",
        one_of="source",
    )
    community: list[str] | None = _c(
        None,
        "ID=RUN: a community's own model (a run directory, or an ONNX export's directory): a "
        "request whose communityId is ID (Coral Talk's is Coral:<site URL>) is answered by "
        "RUN, every other by the base model; X-Model-Version says which. RUN must answer "
        "every attribute the base does. Repeat for several communities.",
        nargs="+",
    )
    communities: str | None = _c(
        None,
        "A directory of communities' heads (jaxtpu head's .head.npz files, one community each): "
        "a request whose communityId has a head gets that head's attribute (TOXICITY) from it, "
        "read off the base model's own pass over the comment, and every other attribute from "
        "the base; X-Model-Version names both. Read again every 2 seconds: a head added or "
        "replaced answers from then on, without a restart; a file that cannot be read, or of "
        "another base model, is said in one line and the head it replaces keeps serving. An ONNX "
        "export serves heads when it gives the vector (an export of jaxtpu's head); --community "
        "ID=RUN wins for its ID.",
    )
    shadow_communities: str | None = _c(
        None,
        "A directory of candidate heads (as --communities'), each compared in shadow with what "
        "answers its community (the head in service, or the base): its score of each comment "
        "of that community, from the same pass of the base, beside the answer's, never "
        "answering; GET /v1/shadow and `jaxtpu shadow report` show it per community. Read "
        "again every 2 seconds, as --communities is.",
    )
    shadow: str | None = _c(
        None,
        "A model (run directory or ONNX export) scored in shadow: after each comments:analyze "
        "answer, the comment is scored by it too (never answering, skipped when the server is "
        "behind, counted in /metrics) and compared per attribute with the answer: mean absolute "
        "difference, rank correlation, and how many comments each puts at or above 0.5, 0.7, "
        "0.8 and 0.9 and how many change side. GET /v1/shadow and `jaxtpu shadow report` show "
        "it; no text is kept.",
    )
    attributes: list[str] | None = _c(
        None,
        "The attributes each model answers, one value per model in order ('' keeps a model's "
        "default): column=NAME,... renames its columns (default: every Jigsaw column's "
        "Perspective name: toxic TOXICITY, severe_toxic SEVERE_TOXICITY, obscene PROFANITY, "
        "threat THREAT, insult INSULT, identity_hate IDENTITY_ATTACK, sexual_explicit "
        'SEXUALLY_EXPLICIT); a rules model needs NAME="rule text",... (each attribute the '
        "probability that the comment breaks that rule).",
        nargs="+",
    )
    languages: str = _c(
        "",
        "Languages the models answer, comma-separated ISO 639-1 codes (a request naming another "
        "is refused) [default: those the run was validated on: its per-language AUCs, else en].",
    )
    host: str = _c(
        "127.0.0.1",
        "Address to listen on (0.0.0.0: every interface; give --api-keys when it is not loopback).",
    )
    port: int = _c(8080, "Port to listen on.", bounds=Bounds(0, 65535))
    api_keys: str | None = _c(
        None,
        "A file of API keys, one a line: KEY [NAME [PER_MINUTE] [moderator]] ('#' at a line's "
        "start or after a space starts a comment; a bare KEY is named key-N, its line, with no "
        "limit; moderator marks a moderators' key, whose suggestions jaxtpu feedback export "
        "learns from by default). A request whose key (?key= or the "
        "X-Goog-Api-Key header) is not one of them gets Perspective's 403, on every route but "
        "/healthz, /readyz and the static page; a key over PER_MINUTE requests a minute gets "
        "429 RESOURCE_EXHAUSTED with Retry-After (counted in each server process). /metrics "
        "counts by NAME, never by key. Without it no key is needed.",
    )
    cors_origins: str | None = _c(
        None,
        "Origins whose web pages may call the server from the browser, comma-separated "
        "(https://news.example.org,https://admin.example.org), or * for any: preflights "
        "(OPTIONS) are answered and every answer to such an origin carries the CORS headers. "
        "Without it no CORS header is sent and browsers keep other origins' pages out.",
    )
    feedback: str | None = _c(
        None,
        "Where comments:suggestscore's suggestions are kept: an SQLite file (PATH, or "
        "sqlite:///PATH; made when missing) or postgresql://USER@HOST:PORT/DATABASE (several "
        "replicas writing one store). Each holds the text, the scores suggested, communityId, "
        "clientToken, sessionId, languages, the time and the model version; a second "
        "suggestion of one clientToken replaces the first. Without it suggestscore is answered "
        "and nothing is kept. comments:analyze never stores anything.",
    )
    feedback_days: float | None = _c(
        None,
        "Drop suggestions older than this many days (at start, then every hour). [default: "
        "keep them]",
        bounds=Bounds(0, 100000, lo_open=True),
    )
    public_url: str | None = _c(
        None,
        "The server's address as its clients reach it (https://toxicity.example.org/, behind a "
        "load balancer or TLS proxy): the root URL of the discovery document Google's client "
        "reads. [default: the address each connection came in on; never the request's Host "
        "header]",
    )
    batch_size: int = _c(
        ScoringConfig.batch_size,
        "Rows per device of each model call. A call is padded to this, or to the smallest "
        "halving of it that the server checked, when it started, gives a call of this size's "
        "scores bitwise (on XLA:CPU some do in fp32, none in bf16), so a comment's "
        "score never depends on the requests it shares a call with, and equals jaxtpu "
        "predict's, evaluate's and jaxtpu.load()'s at the same --batch-size (their default is "
        "this one). --onnx: rows per onnxruntime call, not padded (its kernels take any batch; "
        "a comment's score is the same bitwise in any batch, tests/test_serve.py).",
        bounds=Bounds(1, 65536),
    )
    max_batch: int = _c(
        64,
        "Texts scored together at most (a request's comment, and its sentences with "
        "spanAnnotations): concurrent requests are batched up to this.",
        bounds=Bounds(1, 65536),
    )
    max_wait_ms: float = _c(
        5.0,
        "How long the first request of a batch waits for others (milliseconds).",
        bounds=Bounds(0, 10000),
    )
    max_queue: int = _c(
        256,
        "Requests waiting to be scored at most; beyond it a request gets 429 with Retry-After.",
        bounds=Bounds(1, 10**6),
    )
    max_body_kb: int = _c(
        256,
        "Largest request body (KiB), refused before it is read (comment.text itself is at "
        "most 20 KB, as at Perspective).",
        bounds=Bounds(1, 1 << 20),
    )
    read_timeout: float = _c(
        10.0,
        "Seconds a client has to send its request's headers (from the connection's first "
        "byte), and again its body; a slower one gets 408 and is closed.",
        bounds=Bounds(0, 3600, lo_open=True),
    )
    max_header_kb: int = _c(
        16,
        "Largest request line and headers together (KiB; Node.js's default): more is 431 and "
        "the connection closed, before the rest is read.",
        bounds=Bounds(1, 1024),
    )
    max_headers: int = _c(
        100,
        "Most request headers (Apache's default): more is 431 and the connection closed.",
        bounds=Bounds(1, 10000),
    )
    log_comments: bool = _c(
        False, "Log each request's comment text (without it no comment text is ever logged)."
    )
    drain_seconds: float = _c(
        15.0,
        "On SIGTERM, answer /readyz 503 at once and keep answering requests this long (what a "
        "load balancer or Kubernetes still routes here before it notices), then stop taking "
        "connections and finish those in flight. Kubernetes' terminationGracePeriodSeconds must "
        "exceed it plus the longest request (its default, 30 s, does for this default). A "
        "second SIGTERM, or Ctrl-C, stops at once after the requests in flight. 0: no drain.",
        bounds=Bounds(0, 3600),
    )
    workers: int = _c(
        1,
        "Server processes sharing --port, each with its own copy of the models (memory times "
        "N; a second start loads compiled programs from the cache). Requests go to whichever "
        "is free; a comment gets the same score from any of them.",
        bounds=Bounds(1, 256),
    )
    threads: int = _c(
        0,
        "--onnx: onnxruntime's threads per worker [default 0: the cores divided among --workers].",
        bounds=Bounds(0, 4096),
    )
    no_calibration: bool = _no_calibration()


@dataclass(frozen=True)
class FeedbackDeleteFlags:
    feedback: str | None = _c(
        None,
        "The store `jaxtpu serve --feedback` keeps suggestions in: an SQLite file (PATH or "
        "sqlite:///PATH) or postgresql://USER@HOST:PORT/DATABASE.",
        required=True,
    )
    client_token: str | None = _c(
        None,
        "The clientToken whose suggestions are removed (a user's erasure request; Coral Talk's "
        "tokens are comment:<id>): every key's, unless --owner names one.",
        required=True,
        one_of="which",
    )
    session_id: str | None = _c(
        None,
        "Remove the suggestions of this sessionId (those sent without a clientToken too).",
        required=True,
        one_of="which",
    )
    text: str | None = _c(
        None,
        "Remove the suggestions whose comment text is exactly this (a user who asks for a "
        "comment to be erased, whatever token it was sent with, or none).",
        required=True,
        one_of="which",
    )
    owner: str | None = _c(
        None,
        "Only the suggestions of the API key of this name (--api-keys' NAME; '' for those kept "
        "by a server without keys).",
    )


@dataclass(frozen=True)
class FeedbackExportFlags:
    feedback: str | None = _c(
        None,
        "The store `jaxtpu serve --feedback` keeps suggestions in: an SQLite file (PATH or "
        "sqlite:///PATH) or postgresql://USER@HOST:PORT/DATABASE.",
        required=True,
    )
    out: str | None = _c(
        None,
        "The training file to write (CSV): id, comment_text, one column per column of the run "
        "(blank where a suggestion does not mention it: left out of the loss), community, time.",
        required=True,
    )
    community: str | None = _c(
        None, "Only this community's suggestions (Coral Talk's are Coral:<site URL>)."
    )
    since: str | None = _c(
        None, "Only suggestions received at or after this ISO 8601 date or time (UTC)."
    )
    workdir: str | None = _c(
        None,
        "The run the rows are for: its columns and attribute map (TOXICITY -> toxic, ...). "
        "[default: the six Toxic Comment labels under their Perspective names]",
    )
    decisions: str = _c(
        "",
        "A moderator's decision as a label: NAME=VALUE,... for suggestions naming a decision "
        "rather than a score (Coral Talk's). [default: DELETED=1,APPROVED=0,HIGHLIGHTED=0]",
    )
    decision_attribute: str = _c("TOXICITY", "The attribute whose column a decision labels.")
    sent_by: str = _c(
        "moderators",
        "Whose suggestions become rows: moderators (those of keys marked moderator in "
        "--api-keys, and those a server without keys kept, which cannot tell who sent them: "
        "counted on stderr) or all (every key's, a page's key included: anyone who can read "
        "the page could have sent them).",
        choices=("moderators", "all"),
    )
    overwrite: bool = _c(False, "Replace an existing --out.")


@dataclass(frozen=True)
class ShadowReportFlags:
    url: str = _c(
        "http://127.0.0.1:8080",
        "The server's address (jaxtpu serve --shadow RUN); its GET /v1/shadow is read.",
    )
    key: str | None = _c(None, "An API key of the server's (sent as X-Goog-Api-Key).")
    json: bool = _c(False, "Print the server's record as JSON instead of a table.")


@dataclass(frozen=True)
class HistoryImportFlags:
    comments: str | None = _c(
        None,
        "Coral Talk's comments collection, exported: mongoexport's JSON lines (or --jsonArray) in "
        "Extended JSON, relaxed or canonical, or mongodump's comments.bson. Each comment's "
        "latest revision: its text (HTML to text), Perspective's score and model.",
        required=True,
        one_of="source",
    )
    table: str | None = _c(
        None,
        "A CSV, JSON Lines or Parquet file with a text column (comment_text, text, comment, "
        "body or content) and Perspective's scores as columns named by attribute (TOXICITY, "
        "SEVERE_TOXICITY, ..., in any case); optional id, decision (1/0), community, time.",
        required=True,
        one_of="source",
    )
    actions: str | None = _c(
        None,
        "With --comments: Coral's commentModerationActions collection, exported the same way; a "
        "comment's decision is the latest moderator's action on its latest revision (REJECTED 1, "
        "APPROVED 0; the system's actions and other statuses none).",
    )
    out: str | None = _c(
        None,
        "The history file to write (CSV): id, comment_text, a column per Perspective attribute "
        "the history holds, perspective_model, decision, community, time. Written whole or not "
        "at all.",
        required=True,
    )
    feedback: str | None = _c(
        None,
        "Also keep the moderators' decisions in this feedback store (jaxtpu serve --feedback: "
        "SQLite PATH or postgresql://...), as Coral's suggestions would have been (owner "
        "history-import, a moderator), so jaxtpu feedback export and the community loop read "
        "them.",
    )
    overwrite: bool = _c(False, "Replace an existing --out.")


@dataclass(frozen=True)
class HistoryScaleFlags:
    workdir: str | None = _c(None, "The run whose scores are mapped.", required=True)
    history: str | None = _c(
        None,
        "History files (jaxtpu history import's, or any table with a text column and "
        "Perspective attribute columns), comma-separated. Comments of the run's own training "
        "file are left out: the map is fitted on comments the model did not train on.",
        required=True,
    )
    method: str = _c(
        "quantile",
        "quantile: the run's score at each quantile of its scores goes to Perspective's at the "
        "same quantile, so as many comments pass each threshold as passed Perspective's (what "
        "keeps a platform's thresholds); isotonic: isotonic regression, Perspective's mean "
        "score for each of the run's, which flags fewer comments at 0.8 and 0.9 where the two "
        "disagree.",
        choices=("quantile", "isotonic"),
    )
    readout: bool = _c(
        False,
        "Read each attribute the history scores out of the model's vector anew before mapping "
        "it: a linear layer on the frozen model's pooled vector regressed onto Perspective's "
        "scores (ridge, its L2 strength chosen by 5-fold cross-validation on the history; the "
        "map then fitted on the folds' held-out predictions). It ranks as Perspective does "
        "where the run's own output does not (a Jigsaw model's THREAT, IDENTITY_ATTACK); the "
        "model is not changed, and scoring computes the vector in the same pass. Needs at "
        "least 100 scored comments of an attribute.",
    )
    ngrams: bool = _c(
        False,
        "As --readout, reading each attribute out of the comment's own words beside the "
        "vector: a weight for each of the 20,000 word 1-2-grams and character 2-5-grams found "
        "in the most history comments (the L2 strength again chosen by 5-fold "
        "cross-validation). On the shared Perspective-scored comments it flags closer to "
        "Perspective at 0.8 and 0.9 where the vector blurs the words (IDENTITY_ATTACK, THREAT, "
        "INSULT) and ranks as the vector alone does, or slightly worse "
        "(docs/perspective.md). Wants thousands of scored comments: with fewer, "
        "--readout alone ranks better. Scoring then reads each text's n-grams.",
    )


@dataclass(frozen=True)
class HistoryCompareFlags:
    workdir: str | None = _c(None, "The run to compare with Perspective.", required=True)
    history: str | None = _c(
        None,
        "History files whose comments are scored, comma-separated (as for fit-scale).",
        required=True,
    )
    raw: bool = _c(
        False,
        "Compare the model's raw probabilities (no calibration, no map onto Perspective's "
        "scale), as a run served with --no-calibration answers.",
    )
    report: str | None = _c(None, "Also write the comparison as JSON to this file.")


@dataclass(frozen=True)
class HeadFlags:
    workdir: str | None = _c(
        None,
        "The served run (its best model, frozen: never changed): the head reads its vector of "
        "each comment and its probabilities. A server of this run with --communities serves the "
        "head; one of another model, or of this run with other --attributes or --no-calibration, "
        "refuses it.",
        required=True,
        one_of="source",
    )
    onnx: str | None = _c(
        None,
        "Instead of a run: the ONNX graph a slim server serves (serve --onnx), an export's "
        "model.onnx or model_int8.onnx named as the server names it (a directory lets each "
        "machine pick its faster graph, and a head is of one graph).",
        required=True,
        one_of="source",
    )
    decisions: str | None = _c(
        None,
        "The community's decisions: jaxtpu feedback export's file (comment_text, the attribute's "
        "column: toxic for TOXICITY, 1 removed and 0 kept), or jaxtpu history import's (its "
        "decision column), CSV, JSON Lines or Parquet. Rows without a decision are skipped.",
        required=True,
    )
    out: str | None = _c(
        None,
        "The directory of heads (serve --communities DIR) the head is written into, as "
        "<community>-<hash>.head.npz, whole or not at all; a head already there for the "
        "community is kept beside it as .prev (not served) and replaced.",
        required=True,
    )
    community: str | None = _c(
        None,
        "The community the head answers (its requests' communityId; Coral Talk's is "
        "Coral:<site URL>); only --decisions' rows of it are read when the file has a community "
        "column. Default: the file's one community.",
    )
    attribute: str = _c(
        "TOXICITY",
        "The attribute the head answers for the community (every other comes from the base), "
        "one the run answers.",
    )
    label_column: str | None = _c(
        None,
        "The column holding each decision (>= 0.5: removed). Default: the attribute's column in "
        "the run (toxic for TOXICITY) when the file has it, else decision.",
    )
    folds: int = _c(
        5,
        "Cross-validation folds that choose the head's regularisation on the decisions (fewer "
        "when a class has fewer decisions).",
        bounds=Bounds(2, 20),
    )
