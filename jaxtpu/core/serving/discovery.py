"""The discovery document of the `commentanalyzer` v1alpha1 API as `jaxtpu serve` answers it
(framework-free): what Perspective's documented Python client, google-api-python-client's
`discovery.build("commentanalyzer", "v1alpha1", discoveryServiceUrl=..., developerKey=...)`,
reads to build `service.comments().analyze(body=...)` and `.suggestscore(body=...)`, and its
batches (`new_batch_http_request()`, to `batchPath`). The library ships no static copy of it,
so the server answers it at `/$discovery/rest?version=v1alpha1`, with the server's own address
as the root URL: the client then calls this server and nothing else. Its two methods and
their schemas are Perspective's, field for field.
"""

from __future__ import annotations

from typing import Any

API, VERSION = "commentanalyzer", "v1alpha1"
ANALYZE_PATH = f"{VERSION}/comments:analyze"
SUGGEST_PATH = f"{VERSION}/comments:suggestscore"
BATCH_PATH = "batch"


def _object(description: str, **properties: Any) -> dict[str, Any]:
    return {"type": "object", "description": description, "properties": properties}


def _field(kind: str, description: str, **more: Any) -> dict[str, Any]:
    return {"type": kind, "description": description, **more}


def _schemas() -> dict[str, Any]:
    score = _object(
        "A score and its type.",
        value=_field("number", "The score, in [0, 1].", format="float"),
        type=_field("string", "PROBABILITY."),
    )
    schemas = {
        "TextEntry": _object(
            "A text.",
            text=_field("string", "The text (UTF-8)."),
            type=_field("string", "PLAIN_TEXT (the only type supported)."),
        ),
        "Context": _object(
            "Accepted and ignored, as by Perspective's models.",
            entries={"type": "array", "items": {"$ref": "TextEntry"}},
            articleAndParentComment={"$ref": "ArticleAndParentComment"},
        ),
        "ArticleAndParentComment": _object(
            "The article and the comment this one answers (accepted and ignored).",
            article={"$ref": "TextEntry"},
            parentComment={"$ref": "TextEntry"},
        ),
        "AttributeParameters": _object(
            "How an attribute is scored.",
            scoreType=_field("string", "PROBABILITY (the only type supported)."),
            scoreThreshold=_field("number", "Scores below it are left out.", format="float"),
        ),
        "Score": score,
        "SpanScore": _object(
            "A sentence's score; begin and end in UTF-16 code units of comment.text.",
            begin=_field("integer", "First code unit.", format="int32"),
            end=_field("integer", "One past the last code unit.", format="int32"),
            score={"$ref": "Score"},
        ),
        "AttributeScores": _object(
            "One attribute's scores.",
            summaryScore={"$ref": "Score"},
            spanScores={"type": "array", "items": {"$ref": "SpanScore"}},
        ),
        "AnalyzeCommentRequest": _object(
            "A comment to score.",
            comment={"$ref": "TextEntry"},
            context={"$ref": "Context"},
            requestedAttributes={
                "type": "object",
                "additionalProperties": {"$ref": "AttributeParameters"},
            },
            spanAnnotations=_field("boolean", "Also score each sentence (at most 100)."),
            languages={"type": "array", "items": {"type": "string"}},
            doNotStore=_field("boolean", "Accepted; an analyzed comment is never stored."),
            clientToken=_field("string", "Echoed in the response."),
            sessionId=_field("string", "Accepted and ignored."),
            communityId=_field("string", "Accepted and ignored."),
        ),
        "AnalyzeCommentResponse": _object(
            "The comment's scores.",
            attributeScores={"type": "object", "additionalProperties": {"$ref": "AttributeScores"}},
            languages={"type": "array", "items": {"type": "string"}},
            detectedLanguages={"type": "array", "items": {"type": "string"}},
            clientToken=_field("string", "The request's clientToken."),
        ),
        **_suggest_schemas(),
    }
    for name, schema in schemas.items():
        schema["id"] = name
    return schemas


def _suggest_schemas() -> dict[str, Any]:
    return {
        "SuggestCommentScoreRequest": _object(
            "A client's correction of a comment's scores (kept when the server has --feedback).",
            comment={"$ref": "TextEntry"},
            context={"$ref": "Context"},
            attributeScores={
                "type": "object",
                "additionalProperties": {"$ref": "AttributeScores"},
                "description": "Required, not empty: the scores the client suggests.",
            },
            languages={"type": "array", "items": {"type": "string"}},
            communityId=_field("string", "The community the suggestion is for."),
            clientToken=_field("string", "A second suggestion of one token replaces the first."),
            sessionId=_field("string", "Kept with the suggestion."),
        ),
        "SuggestCommentScoreResponse": _object(
            "What the server read of the suggestion.",
            clientToken=_field("string", "The request's clientToken."),
            detectedLanguages={"type": "array", "items": {"type": "string"}},
            requestedLanguages={"type": "array", "items": {"type": "string"}},
        ),
    }


def document(root_url: str) -> dict[str, Any]:
    """The discovery document, every call going to `root_url` (ends with '/')."""
    query = {"type": "string", "location": "query"}
    return {
        "kind": "discovery#restDescription",
        "discoveryVersion": "v1",
        "id": f"{API}:{VERSION}",
        "name": API,
        "version": VERSION,
        "title": "Perspective Comment Analyzer API (served by jaxtpu)",
        "description": "Scores comments with a model trained by jaxtpu, as Perspective API did.",
        "protocol": "rest",
        "rootUrl": root_url,
        "servicePath": "",
        "baseUrl": root_url,
        "batchPath": BATCH_PATH,
        "parameters": {
            "key": {**query, "description": "API key (when the server is started with keys)."},
            "alt": {**query, "description": "Data format for the response.", "default": "json"},
            "fields": {**query, "description": "Accepted and ignored."},
            "prettyPrint": {"type": "boolean", "location": "query", "default": "true"},
        },
        "schemas": _schemas(),
        "resources": {
            "comments": {
                "methods": {
                    "analyze": {
                        "id": f"{API}.comments.analyze",
                        "path": ANALYZE_PATH,
                        "flatPath": ANALYZE_PATH,
                        "httpMethod": "POST",
                        "description": "Analyzes the provided text and returns scores.",
                        "parameters": {},
                        "parameterOrder": [],
                        "request": {"$ref": "AnalyzeCommentRequest"},
                        "response": {"$ref": "AnalyzeCommentResponse"},
                    },
                    "suggestscore": {
                        "id": f"{API}.comments.suggestscore",
                        "path": SUGGEST_PATH,
                        "flatPath": SUGGEST_PATH,
                        "httpMethod": "POST",
                        "description": "Suggest comment scores as training data.",
                        "parameters": {},
                        "parameterOrder": [],
                        "request": {"$ref": "SuggestCommentScoreRequest"},
                        "response": {"$ref": "SuggestCommentScoreResponse"},
                    },
                }
            }
        },
    }
