# Generates admin-openapi.json, the server API's OpenAPI document
# (docs/admin.md is its prose form). Run from the repository root:
#   python3 protocol/schema/gen_admin.py
import json

def ref(n): return {"$ref": "#/components/schemas/" + n}
def fr(n): return {"$ref": "frames.json#/$defs/" + n}
def obj(props, required):
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}
ID = {"type": "string", "pattern": "^[A-Za-z0-9._@-]{1,64}$"}
U64S = {"type": "string", "pattern": "^[0-9]{1,20}$"}
MS = {"type": "integer", "minimum": 0, "description": "Unix milliseconds"}

schemas = {
    "Error": obj({"code": fr("Code"), "error": {"type": "string"}}, ["code", "error"]),
    "ConvAnswer": obj({"conv": fr("ConvInfo")}, ["conv"]),
    "ListAnswer": obj({"conversations": {"type": "array", "items": fr("ConvSummary")},
                       "next": {**U64S, "description": "present when more follow: the after of the next page"}},
                      ["conversations"]),
    "Ack": obj({"conv_id": U64S, "client_msg_id": {"type": "string", "minLength": 1}, "seq": {"type": "integer", "minimum": 1},
                "msg_id": U64S, "server_time": MS, "duplicate": {"type": "boolean"}},
               ["conv_id", "client_msg_id", "seq", "msg_id", "server_time"]),
    "AckAnswer": obj({"ack": ref("Ack")}, ["ack"]),
    "Entry": obj({"user": ID, "device": ID, "banned": {"type": "boolean"}, "banned_at": MS,
                  "reason": {"type": "string", "maxLength": 256}, "revoked_before": MS, "updated_at": MS},
                 ["user", "banned", "updated_at"]),
    "EntryAnswer": obj({"entry": ref("Entry")}, ["entry"]),
    "EntriesAnswer": obj({"entries": {"type": "array", "items": ref("Entry")}}, ["entries"]),
    "DisconnectAnswer": obj({"sessions": {"type": "integer", "minimum": 0}}, ["sessions"]),
    "Attachment": obj({"attachment_id": U64S, "owner": ID, "size": {"type": "integer", "minimum": 0},
                       "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"}, "media_type": {"type": "string"},
                       "name": {"type": "string"}, "state": {"enum": ["uploading", "complete", "attached", "deleting"]},
                       "created_at": MS, "seq": {"type": "integer", "minimum": 1, "description": "the message that names the file (attached, once stored)"}},
                      ["attachment_id", "owner", "size", "sha256", "media_type", "name", "state", "created_at"]),
    "AttachmentsAnswer": obj({"attachments": {"type": "array", "items": ref("Attachment")},
                              "next": {**U64S, "description": "present when more follow: the after of the next page"}},
                             ["attachments"]),
    # Request bodies (unknown fields are refused with bad_frame).
    "DirectRequest": obj({"users": {"type": "array", "items": ID, "minItems": 2, "maxItems": 2}, "e2e": {"type": "boolean"}}, ["users"]),
    "GroupRequest": obj({"owner": ID, "name": {"type": "string"}, "members": {"type": "array", "items": ID}, "e2e": {"type": "boolean"}}, ["owner"]),
    "MembersRequest": obj({"users": {"type": "array", "items": ID, "minItems": 1}}, ["users"]),
    "RoleRequest": obj({"role": {"enum": ["member", "admin", "owner"]}}, ["role"]),
    "MuteRequest": obj({"muted": {"type": "boolean"}}, ["muted"]),
    "MessageRequest": obj({"as": {"enum": ["user", "bot", "system"]}, "sender": ID, "device": ID,
                           "client_msg_id": {"type": "string", "minLength": 1, "maxLength": 64}, "body": {"type": "string"},
                           "kind": {"enum": ["text", "state"]}, "coalesce_key": {"type": "string"},
                           "mentions": {"type": "array", "items": ID}, "mention_all": {"type": "boolean"},
                           "text": {"type": "string", "description": "as system: the notice's text"}}, ["client_msg_id"]),
    "EditRequest": obj({"client_msg_id": {"type": "string", "minLength": 1, "maxLength": 64}, "body": {"type": "string", "minLength": 1}}, ["client_msg_id", "body"]),
    "BanRequest": obj({"reason": {"type": "string", "maxLength": 256}}, []),
    "RevokeRequest": obj({"before": {"type": "integer", "minimum": 1, "description": "Unix ms; absent: now"}, "device": ID}, []),
    "DisconnectRequest": obj({"device": ID}, []),
    "SearchRequest": obj({"user_id": {**ID, "description": "search as this user, within the user's membership windows (as the user's search frame); absent: query.conv_id is required and that conversation is searched whole"},
                          "query": fr("SearchQuery")}, ["query"]),
    "SearchAnswer": obj({"search": fr("SearchResult")}, ["search"]),
    "ReindexRequest": obj({"conv_id": {**U64S, "description": "rebuild this conversation only; absent: every plain conversation"}}, []),
}

def err(desc): return {"description": desc, "content": {"application/json": {"schema": ref("Error")}}}
COMMON = {
    "400": err("bad_frame (not a JSON object, a field of the wrong type, an unknown field), invalid_argument, e2e_required, e2e_unsupported"),
    "401": err("unauthorized: no admin key or the wrong one"),
    "404": err("not_found: no such endpoint, conversation, message or member"),
    "413": err("too_large: a body over 1 MiB, or a list, name or body over its limit"),
    "500": err("internal"),
    "503": err("store_unavailable or overloaded: nothing was done; retry"),
    "504": err("timeout"),
}
CHAT = {**COMMON, "403": err("not_member or forbidden (as the client path answers)"),
        "409": err("conflict or recall_window_passed"), "429": err("rate_limited")}

def op(summary, ok, answer, req=None, params=(), errors=CHAT, query=()):
    answered = {"204": {"description": ok}} if answer is None else {"200": {"description": ok, "content": {"application/json": {"schema": ref(answer)}}}}
    o = {"summary": summary, "security": [{"adminKey": []}], "responses": {**answered, **errors}}
    ps = [{"name": p, "in": "path", "required": True, "schema": U64S if p in ("conv_id", "attachment_id") else ({"type": "integer", "minimum": 1} if p == "seq" else ID)} for p in params]
    ps += [{"name": q, "in": "query", "required": False, "schema": s} for q, s in query]
    if ps: o["parameters"] = ps
    if req: o["requestBody"] = {"required": False, "content": {"application/json": {"schema": ref(req)}}}
    return o

C = "/v1/admin/conversations"
U = "/v1/admin/users/{user_id}"
paths = {
    C + "/direct": {"post": op("the direct conversation of two users (created on first use), as open_direct", "the conversation", "ConvAnswer", "DirectRequest")},
    C + "/group": {"post": op("create a group owned by owner, as owner's create_group", "the group", "ConvAnswer", "GroupRequest")},
    C + "/{conv_id}": {"get": op("any conversation", "the conversation (no role, join_seq 0)", "ConvAnswer", params=["conv_id"])},
    C + "/{conv_id}/members": {"post": op("add members with the admin authority (event member_added, admin: true)", "the group", "ConvAnswer", "MembersRequest", ["conv_id"])},
    C + "/{conv_id}/members/{user_id}": {"delete": op("remove a member (not the owner) with the admin authority", "the group", "ConvAnswer", params=["conv_id", "user_id"])},
    C + "/{conv_id}/members/{user_id}/role": {"put": op("set a member's role; owner hands the group over", "the group", "ConvAnswer", "RoleRequest", ["conv_id", "user_id"])},
    C + "/{conv_id}/members/{user_id}/mute": {"put": op("mute or unmute a member (not the owner)", "the group", "ConvAnswer", "MuteRequest", ["conv_id", "user_id"])},
    C + "/{conv_id}/messages": {"post": op("send as a user, a bot, or a system notice", "stored (ack)", "AckAnswer", "MessageRequest", ["conv_id"])},
    C + "/{conv_id}/messages/{seq}": {
        "patch": op("moderation edit of any text message (not in E2E conversations)", "stored (ack of the edit event)", "AckAnswer", "EditRequest", ["conv_id", "seq"]),
        "delete": op("moderation recall (delete for everyone) of any text message", "stored (ack of the recall event)", "AckAnswer", params=["conv_id", "seq"],
                     query=[("client_msg_id", {"type": "string", "minLength": 1, "maxLength": 64})]),
    },
    U + "/conversations": {"get": op("a user's conversation list, as conv_list answers it, by conv_id, paged", "a page", "ListAnswer", params=["user_id"],
                                     query=[("after", U64S), ("limit", {"type": "integer", "minimum": 1, "maximum": 200})])},
    U + "/access": {"get": op("the user's access entries (the user's, then its devices')", "the entries", "EntriesAnswer", params=["user_id"], errors=COMMON)},
    U + "/ban": {"post": op("ban: refuse new connections and requests, close open ones (4003)", "the user's entry", "EntryAnswer", "BanRequest", ["user_id"], errors=COMMON),
                 "delete": op("lift a ban", "the user's entry", "EntryAnswer", params=["user_id"], errors=COMMON)},
    U + "/revoke": {"post": op("refuse tokens issued before a time, of the user or one device; close their connections (4002)", "the entry", "EntryAnswer", "RevokeRequest", ["user_id"], errors=COMMON)},
    C + "/{conv_id}/attachments": {"get": op("a conversation's attachment records (every state), by attachment_id, paged", "a page", "AttachmentsAnswer", params=["conv_id"],
                                             query=[("after", U64S), ("limit", {"type": "integer", "minimum": 1, "maximum": 1000})])},
    "/v1/admin/attachments/{attachment_id}": {"delete": op("delete an attachment (its file, thumbnail and record); the message naming it stays, attachment_url answers not_found", "deleted", None, params=["attachment_id"])},
    "/v1/admin/backup": {"post": {"summary": "a consistent archive of an embedded node's data directory, taken while it serves (docs/deploy.md, \"Back up and restore\"): a tar stream, manifest first (PARLEY-BACKUP.json), end marker last (PARLEY-BACKUP-END.json); an archive without the marker is incomplete",
                                  "security": [{"adminKey": []}],
                                  "responses": {"200": {"description": "the archive", "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}}},
                                                "401": COMMON["401"], "409": err("conflict: another backup is running"),
                                                "400": err("invalid_argument: the node runs in cluster mode (back up its engines)"), "500": err("internal: a checkpoint failed")}}},
    "/v1/admin/search": {"post": op("search plain conversations' messages as a user, or one conversation whole (docs/admin.md, \"Search\")", "a page of hits", "SearchAnswer", "SearchRequest",
                                    errors={**COMMON, "400": err("bad_frame (not a JSON object, a field of the wrong type, an unknown field), invalid_argument (no query text, neither user_id nor query.conv_id, a bad filter), query_too_long, query_too_complex, bad_cursor, e2e_unsupported"),
                                            "403": err("not_member: user_id was never a member of query.conv_id"),
                                            "503": err("search_unavailable (the node has no search index), store_unavailable or overloaded")})},
    "/v1/admin/search/reindex": {"post": {"summary": "rebuild the search index of one conversation or of every plain one while the node serves (docs/admin.md, \"Search\"): a stream of JSON lines, {\"progress\":{\"conversations\",\"messages\",\"total_conversations\",\"total_messages\"}} once counted and after each conversation, then {\"done\":{...}} or {\"error\":{\"code\",\"error\"}}",
                                          "security": [{"adminKey": []}],
                                          "requestBody": {"required": False, "content": {"application/json": {"schema": ref("ReindexRequest")}}},
                                          "responses": {"200": {"description": "the progress stream; its last line says how it ended", "content": {"application/x-ndjson": {"schema": {"type": "string"}}}},
                                                        "400": err("bad_frame, invalid_argument: conv_id is no conversation id"), "401": COMMON["401"],
                                                        "413": COMMON["413"], "503": err("search_unavailable: the node has no search index of its own")}}},
    U + "/disconnect": {"post": op("close the user's sessions (of one device) on every gateway (4004)", "sessions found", "DisconnectAnswer", "DisconnectRequest", ["user_id"], errors=COMMON)},
}
doc = {"openapi": "3.1.0",
       "info": {"title": "Parley server API", "version": "1",
                "description": "Generated by protocol/schema/gen_admin.py; docs/admin.md is the prose contract. Served on admin.listen only. Any other path or method answers 404 with the Error body (code not_found); every request without the admin key answers 401 unauthorized."},
       "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
       "components": {"securitySchemes": {"adminKey": {"type": "http", "scheme": "bearer", "description": "the admin key (admin.key), never a user token"}},
                      "schemas": schemas},
       "paths": paths}
json.dump(doc, open("protocol/schema/admin-openapi.json", "w"), indent=1)
open("protocol/schema/admin-openapi.json", "a").write("\n")
