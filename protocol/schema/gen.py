import json
U64S={"type":"string","pattern":"^[0-9]{1,20}$","description":"unsigned 64-bit id as a decimal string"}
SEQ={"type":"integer","minimum":0}
MS={"type":"integer","description":"Unix milliseconds"}
ID={"type":"string","pattern":"^[A-Za-z0-9._@-]{1,64}$"}
STR={"type":"string"}
BOOL={"type":"boolean"}
RID={"type":"string","maxLength":64}
def ref(n): return {"$ref":"#/$defs/"+n}
def arr(x): return {"type":"array","items":x}
def obj(props, required, desc=None, closed=True):
    o={"type":"object","properties":props,"required":required}
    if closed: o["additionalProperties"]=False
    if desc: o["description"]=desc
    return o
CODES=["bad_frame","unknown_type","invalid_argument","too_large","unauthorized","token_expired","not_member","forbidden","not_found","conflict","recall_window_passed","rate_limited","store_unavailable","overloaded","internal","timeout","e2e_required","e2e_unsupported","bad_key","token_revoked","banned","account_conflict","quota_exceeded","too_many_uploads","size_mismatch","hash_mismatch","part_out_of_order","upload_incomplete","not_ready","too_many_registrations","bad_reference"]
defs={
 "ConvID":U64S,"MsgID":U64S,"UserID":ID,
 "Message":obj({"conv_id":ref("ConvID"),"seq":SEQ,"msg_id":ref("MsgID"),"sender":ID,"sender_device":ID,
   "client_msg_id":{"type":"string","minLength":1},"kind":{"enum":["text","edit","recall","system","state","file"]},
   "body":STR,"target_seq":SEQ,"server_time":MS,"edited":BOOL,"recalled":BOOL,"mentions":arr(ID),
   "mention_all":BOOL,"coalesce_key":STR,"superseded":BOOL,
   "attachment_id":{**U64S,"description":"kind file: the attachment the message names (absent once recalled)"},
   "reply_to":{"type":"integer","minimum":1,"description":"the seq of the message this one answers (kept through edits)"},
   "reply_recalled":{**BOOL,"description":"reads (history, sync, last_message): the message reply_to names is recalled"}},
   ["conv_id","seq","msg_id","sender","kind","server_time"],"a stored message or event"),
 "Position":obj({"conv_id":ref("ConvID"),"seq":{"type":"integer","minimum":1}},["conv_id","seq"]),
 "SyncConv":obj({"conv_id":ref("ConvID"),"after_seq":SEQ},["conv_id","after_seq"]),
 "ConvSnapshot":obj({"conv_id":ref("ConvID"),"kind":{"enum":["direct","group"]},"last_seq":SEQ,"read_seq":SEQ,
   "join_seq":SEQ,"unread":SEQ,"from_seq":SEQ,"more_unread":SEQ,"messages":arr(ref("Message"))},
   ["conv_id","kind","last_seq","read_seq","join_seq","unread","from_seq","messages"]),
 "ConvSummary":obj({"conv_id":ref("ConvID"),"kind":{"enum":["direct","group"]},"name":STR,"peer":ID,"last_seq":SEQ,
   "read_seq":SEQ,"join_seq":SEQ,"unread":SEQ,"mentioned":BOOL,"leave_seq":SEQ,"last_message":ref("Message"),"e2e":BOOL,"peer_read_seq":SEQ,"peer_delivered_seq":SEQ},
   ["conv_id","kind","last_seq","read_seq","join_seq","unread"]),
 "ConvInfo":obj({"conv_id":ref("ConvID"),"kind":{"enum":["direct","group"]},"name":STR,"members":arr(ID),
   "member_count":SEQ,"last_seq":SEQ,"join_seq":SEQ,"role":{"enum":["owner","admin","member"]},
   "tier":{"enum":["small","medium","large"]},"e2e":BOOL},["conv_id","kind","members","member_count","last_seq","join_seq"]),
 "Bytes":{"type":"string","contentEncoding":"base64","pattern":"^[A-Za-z0-9+/]*={0,2}$"},
 "PreKey":obj({"id":{"type":"integer","minimum":0,"maximum":4294967295},"key":{"$ref":"#/$defs/Bytes"},"sig":{"$ref":"#/$defs/Bytes"}},["id","key"]),
 "KeyUpload":obj({"registration_id":{"type":"integer","minimum":0},"identity_key":{"$ref":"#/$defs/Bytes"},"account_key":{"$ref":"#/$defs/Bytes"},"device_sig":{"$ref":"#/$defs/Bytes"},"replace_account":BOOL,"signed_prekey":{"$ref":"#/$defs/PreKey"},
   "last_resort_kem":{"$ref":"#/$defs/PreKey"},"prekeys":arr({"$ref":"#/$defs/PreKey"}),"kem_prekeys":arr({"$ref":"#/$defs/PreKey"})},[]),
 "KeyBundle":obj({"user_id":ID,"device_id":ID,"registration_id":{"type":"integer","minimum":0},"identity_key":{"$ref":"#/$defs/Bytes"},
   "account_key":{"$ref":"#/$defs/Bytes"},"device_sig":{"$ref":"#/$defs/Bytes"},"signed_prekey":{"$ref":"#/$defs/PreKey"},"prekey":{"$ref":"#/$defs/PreKey"},"kem_prekey":{"$ref":"#/$defs/PreKey"},"kem_last_resort":BOOL,"limited":BOOL},
   ["user_id","device_id","registration_id","identity_key","signed_prekey"]),
 "DeviceKeyInfo":obj({"device_id":ID,"registration_id":{"type":"integer","minimum":0},"identity_key":{"$ref":"#/$defs/Bytes"},"account_key":{"$ref":"#/$defs/Bytes"},"device_sig":{"$ref":"#/$defs/Bytes"},"updated_at":MS},
   ["device_id","registration_id","identity_key","updated_at"]),
 "KTProof":obj({"checkpoint":{"type":"string","minLength":1,"description":"the log's current signed checkpoint (C2SP tlog-checkpoint note)"},
   "label":{"$ref":"#/$defs/Bytes"},"vrf_proof":{"$ref":"#/$defs/Bytes"},"index":SEQ,"entry":{"$ref":"#/$defs/Bytes"},
   "proof":arr({"$ref":"#/$defs/Bytes"}),"entries":arr({"$ref":"#/$defs/Bytes"}),"from":SEQ},["checkpoint"],
   "key transparency: a user's latest entry and its inclusion proof, a consistency proof, or a page of leaves"),
 "KTKeys":obj({"origin":{"type":"string","minLength":1},"note_key":{"type":"string","minLength":1},"vrf_key":{"$ref":"#/$defs/Bytes"}},
   ["origin","note_key","vrf_key"],"the key transparency log's public keys"),
 "KeyCounts":obj({"prekeys":SEQ,"kem_prekeys":SEQ},["prekeys","kem_prekeys"]),
 "PresenceState":obj({"user_id":ID,"online":BOOL,"last_seen":MS},["user_id","online"]),
 "Limits":obj({k:{"type":"integer","minimum":1} for k in ["max_frame_bytes","max_body_bytes","max_client_msg_id","max_sync_convs","max_history","max_group_members","max_name_bytes","max_mentions","max_presence_subs"]},
   ["max_frame_bytes","max_body_bytes","max_client_msg_id","max_sync_convs","max_history","max_group_members","max_name_bytes","max_mentions","max_presence_subs"]),
 "Hello":obj({"protocol":{"const":1},"session_id":STR,"user_id":ID,"device_id":ID,"node":STR,"server_time":MS,
   "heartbeat_ms":{"type":"integer","minimum":1},"idle_timeout_ms":{"type":"integer","minimum":1},"limits":ref("Limits"),
   "max_file_bytes":{"type":"integer","minimum":0,"description":"largest file an upload may declare; 0: attachments are off"},
   "part_bytes":{"type":"integer","minimum":0,"description":"size of every part of an upload but the last (0 with attachments off)"}},
   ["protocol","session_id","user_id","device_id","node","server_time","heartbeat_ms","idle_timeout_ms","limits","max_file_bytes","part_bytes"]),
 "Code":{"enum":CODES},
 "UploadInfo":obj({"attachment_id":U64S,"conv_id":ref("ConvID"),"size":{"type":"integer","minimum":0},
   "sha256":{"type":"string","pattern":"^[0-9a-f]{64}$"},"media_type":{"type":"string","minLength":3,"maxLength":127},
   "name":{"type":"string","minLength":1},"state":{"enum":["uploading","complete","attached"]},
   "part_size":{"type":"integer","minimum":1},"parts":{"type":"integer","minimum":1,"maximum":10000},
   "received":{"type":"integer","minimum":0,"maximum":10000,"description":"parts 1..received are stored; the next to send is received+1"},
   "expires_at":{**MS,"description":"an upload not complete, or complete and named by no message, is deleted then; absent once attached"},
   "target":{"enum":["parley","s3"]},
   "part":{"type":"integer","minimum":1,"maximum":10000},
   "url":{"type":"string","minLength":1,"description":"upload_part only: PUT exactly the part's bytes here; parley: /v1/uploads/<id>/parts/<n>?exp=&sig= relative to the server's origin, s3: a presigned URL"},
   "url_expires_at":MS,"width":{"type":"integer","minimum":0},"height":{"type":"integer","minimum":0},
   "thumbnail":{"enum":["pending","ready","none","refused"]}},
   ["attachment_id","conv_id","size","sha256","media_type","name","state","part_size","parts","received","target"],"an upload: where it stands, and (answering upload_part) where part N goes"),
 "AttachmentInfo":obj({"attachment_id":U64S,"conv_id":ref("ConvID"),"seq":{"type":"integer","minimum":1},"size":{"type":"integer","minimum":0},
   "sha256":{"type":"string","pattern":"^[0-9a-f]{64}$"},"media_type":STR,"name":STR,"width":{"type":"integer","minimum":0},
   "height":{"type":"integer","minimum":0},"thumbnail":{"enum":["pending","ready","none","refused"]},
   "url":{"type":"string","minLength":1,"description":"GET (Range requests work): Parley's /v1/files/<id>?... relative to the server's origin, or a presigned S3 URL"},
   "url_expires_at":MS},
   ["attachment_id","conv_id","seq","size","sha256","media_type","name","url","url_expires_at"],"a file and the URL to download it (or its thumbnail)"),
 "PushRegistration":obj({"provider":{"enum":["apns","fcm","webpush"]},
   "token":{"type":"string","minLength":1,"maxLength":4096,"pattern":"^[!-~]+$","description":"apns: the device token; fcm: the registration token"},
   "topic":{"type":"string","minLength":1,"maxLength":255,"pattern":"^[!-~]+$","description":"apns: the app's bundle id (apns-topic); required by push_register"},
   "sandbox":{"type":"boolean","description":"apns: the development environment"},
   "endpoint":{"type":"string","minLength":9,"maxLength":4096,"pattern":"^https://[!-~]+$","description":"webpush: the PushSubscription's endpoint"},
   "p256dh":{"type":"string","pattern":"^[A-Za-z0-9_-]+={0,2}$","description":"webpush: the subscription's P-256 key, base64url (65 bytes); required by push_register"},
   "auth":{"type":"string","pattern":"^[A-Za-z0-9_-]+={0,2}$","description":"webpush: the subscription's auth secret, base64url (16 bytes); required by push_register"},
   "updated_at":{**MS,"description":"answers only: when it was last registered"}},["provider"],
   "a device's registration with a push provider: token (apns, fcm) or endpoint (webpush)"),
 "FileBody":obj({"attachment_id":U64S,"name":STR,"size":{"type":"integer","minimum":0},"media_type":STR,
   "sha256":{"type":"string","pattern":"^[0-9a-f]{64}$"},"width":{"type":"integer","minimum":0},"height":{"type":"integer","minimum":0},
   "duration_ms":{"type":"integer","minimum":0},"thumbnail":{"enum":["pending","ready","refused"]},"caption":STR},
   ["attachment_id","name","size","media_type","sha256"],"the body (JSON text) of a kind file message in a plain conversation, composed by the server"),
}
def frame(t, props, required, desc):
    p={"type":{"const":t}}; p.update(props)
    return obj(p, ["type"]+required, desc)
server={
 "hello":frame("hello",{"hello":ref("Hello")},["hello"],"first frame on every connection"),
 "pong":frame("pong",{"rid":RID,"server_time":MS},["server_time"],"answer to ping"),
 "ack":frame("ack",{"rid":RID,"conv_id":ref("ConvID"),"client_msg_id":STR,"seq":{"type":"integer","minimum":1},"msg_id":ref("MsgID"),"server_time":MS,"duplicate":BOOL},["conv_id","client_msg_id","seq","msg_id","server_time"],"send/edit/recall stored"),
 "ok":frame("ok",{"rid":RID},[],"a request that needs no other answer succeeded"),
 "error":frame("error",{"rid":RID,"code":ref("Code"),"error":STR,"retry_after_ms":{"type":"integer","minimum":1}},["code","error"],"the request failed"),
 "msg":frame("msg",{"message":ref("Message"),"ack":{"enum":["batch","none"],"description":"acknowledgement policy (absent: acknowledge promptly); batch: coalesce acks about once a second; none: untracked, do not acknowledge"}},["message"],"push: a stored message or event"),
 "receipt":frame("receipt",{"conv_id":ref("ConvID"),"user_id":ID,"device_id":ID,"seq":SEQ,"state":{"enum":["delivered","read"]}},["conv_id","user_id","seq","state"],"push: a position moved"),
 "snapshot":frame("snapshot",{"rid":RID,"snapshot":arr(ref("ConvSnapshot"))},["snapshot"],"answer to sync"),
 "history":frame("history",{"rid":RID,"conv_id":ref("ConvID"),"messages":arr(ref("Message")),"has_more":BOOL},["conv_id","messages"],"answer to history"),
 "conv_list":frame("conv_list",{"rid":RID,"list":arr(ref("ConvSummary"))},["list"],"answer to conv_list"),
 "conv":frame("conv",{"rid":RID,"conv":ref("ConvInfo")},["conv"],"answer to the group and direct requests"),
 "goaway":frame("goaway",{"retry_after_ms":{"type":"integer","minimum":0}},[],"the node is draining"),
 "presence":frame("presence",{"rid":RID,"states":arr(ref("PresenceState"))},["states"],"answer to presence_sub, and push"),
 "typing":frame("typing",{"conv_id":ref("ConvID"),"user_id":ID},["conv_id","user_id"],"push: a member is typing"),
 "keys":frame("keys",{"rid":RID,"counts":ref("KeyCounts")},["counts"],"answer to keys_upload and keys_remove"),
 "bundles":frame("bundles",{"rid":RID,"user_id":ID,"bundles":arr(ref("KeyBundle")),"kt":ref("KTProof")},["user_id","bundles"],"answer to keys_bundle"),
 "devices":frame("devices",{"rid":RID,"user_id":ID,"devices":arr(ref("DeviceKeyInfo")),"kt":ref("KTProof")},["user_id","devices"],"answer to keys_devices"),
 "kt_keys":frame("kt_keys",{"rid":RID,"kt_keys":ref("KTKeys")},["kt_keys"],"answer to kt_keys"),
 "kt_proof":frame("kt_proof",{"rid":RID,"kt":ref("KTProof")},["kt"],"answer to kt_consistency"),
 "kt_leaves":frame("kt_leaves",{"rid":RID,"kt":ref("KTProof")},["kt"],"answer to kt_leaves"),
 "upload":frame("upload",{"rid":RID,"upload":ref("UploadInfo")},["upload"],"answer to upload_create, upload_status, upload_part and upload_complete"),
 "attachment":frame("attachment",{"rid":RID,"attachment":ref("AttachmentInfo")},["attachment"],"answer to attachment_url"),
 "push":frame("push",{"rid":RID,"registrations":arr(ref("PushRegistration"))},["registrations"],"answer to push_register and push_remove: this device's registrations"),
 "keys_low":frame("keys_low",{"user_id":ID,"device_id":ID,"counts":ref("KeyCounts")},["user_id","device_id","counts"],"push: a device's one-time prekeys run low"),
}
C={"rid":RID}
def cf(t, props, required, desc):
    p=dict(C); p.update(props); return frame(t,p,required,desc)
client={
 "ping":cf("ping",{},[],"heartbeat"),
 "send":{**cf("send",{"conv_id":ref("ConvID"),"client_msg_id":{"type":"string","minLength":1,"maxLength":64},"body":{"type":"string","minLength":1},"kind":{"enum":["text","state","file"]},"coalesce_key":STR,"mentions":arr(ID),"mention_all":BOOL,
   "attachment_id":{**U64S,"description":"kind file only: the completed upload the message sends"},
   "reply_to":{"type":"integer","minimum":0,"description":"the seq of an earlier message of the conversation this one answers (text and file; 0: none)"}},["conv_id","client_msg_id"],"store a message"),
   "if":{"properties":{"kind":{"const":"file"}},"required":["kind"]},"then":{"required":["attachment_id"]},"else":{"required":["body"],"not":{"required":["attachment_id"]}}},
 "edit":cf("edit",{"conv_id":ref("ConvID"),"client_msg_id":{"type":"string","minLength":1,"maxLength":64},"target_seq":{"type":"integer","minimum":1},"body":{"type":"string","minLength":1}},["conv_id","client_msg_id","target_seq","body"],"edit a message"),
 "recall":cf("recall",{"conv_id":ref("ConvID"),"client_msg_id":{"type":"string","minLength":1,"maxLength":64},"target_seq":{"type":"integer","minimum":1},"body":{"type":"string","minLength":1,"description":"end-to-end encrypted conversations only: the author's sealed recall, an E2E envelope"}},["conv_id","client_msg_id","target_seq"],"recall a message"),
 "delivered":{**cf("delivered",{"conv_id":ref("ConvID"),"seq":SEQ,"positions":{**arr(ref("Position")),"minItems":1}},[],"cumulative delivered positions: conv_id and seq, or positions"),
   "oneOf":[{"required":["conv_id","seq"],"not":{"required":["positions"]}},{"required":["positions"],"not":{"anyOf":[{"required":["conv_id"]},{"required":["seq"]}]}}]},
 "read":cf("read",{"conv_id":ref("ConvID"),"seq":SEQ},["conv_id","seq"],"raise the read position"),
 "sync":cf("sync",{"all":BOOL,"convs":arr(ref("SyncConv"))},[],"batch snapshot"),
 "history":cf("history",{"conv_id":ref("ConvID"),"after_seq":SEQ,"before_seq":SEQ,"limit":{"type":"integer","minimum":0}},["conv_id"],"a page of messages"),
 "conv_list":cf("conv_list",{},[],"the conversation list"),
 "open_direct":cf("open_direct",{"peer":ID,"e2e":BOOL},["peer"],"the direct conversation with peer"),
 "create_group":cf("create_group",{"name":STR,"members":arr(ID),"e2e":BOOL},[],"create a group"),
 "add_members":cf("add_members",{"conv_id":ref("ConvID"),"members":arr(ID)},["conv_id","members"],"add members"),
 "remove_members":cf("remove_members",{"conv_id":ref("ConvID"),"members":arr(ID)},["conv_id","members"],"remove members"),
 "leave":cf("leave",{"conv_id":ref("ConvID")},["conv_id"],"leave a group"),
 "set_role":cf("set_role",{"conv_id":ref("ConvID"),"user_id":ID,"role":{"enum":["member","admin","owner"]}},["conv_id","user_id","role"],"set a member's role"),
 "mute":cf("mute",{"conv_id":ref("ConvID"),"user_id":ID,"muted":BOOL},["conv_id","user_id"],"mute or unmute a member"),
 "presence_sub":cf("presence_sub",{"users":arr(ID)},[],"replace the presence watch list"),
 "typing":cf("typing",{"conv_id":ref("ConvID")},["conv_id"],"tell the other members you are typing"),
 "keys_upload":cf("keys_upload",{"keys":ref("KeyUpload")},["keys"],"publish this device's E2E keys"),
 "keys_bundle":cf("keys_bundle",{"user_id":ID,"device_id":ID},["user_id"],"fetch prekey bundles"),
 "keys_devices":cf("keys_devices",{"user_id":ID},["user_id"],"list a user's devices with keys"),
 "keys_remove":cf("keys_remove",{},[],"drop this device's keys"),
 "upload_create":cf("upload_create",{"conv_id":ref("ConvID"),"size":{"type":"integer","minimum":0},"sha256":{"type":"string","pattern":"^[0-9a-f]{64}$"},
   "media_type":{"type":"string","pattern":"^[!-~]+/[!-~]+$","maxLength":127},"name":{"type":"string","minLength":1,"description":"1-255 bytes of UTF-8 without control characters, / or \\"}},
   ["conv_id","sha256","media_type","name"],"declare a file to upload to a conversation"),
 "upload_status":cf("upload_status",{"attachment_id":U64S},["attachment_id"],"where one of your uploads stands"),
 "upload_part":cf("upload_part",{"attachment_id":U64S,"part":{"type":"integer","minimum":1,"maximum":10000}},["attachment_id","part"],"the URL part N of an upload goes to"),
 "upload_complete":cf("upload_complete",{"attachment_id":U64S},["attachment_id"],"check the uploaded file's size and SHA-256 and make it usable"),
 "kt_keys":cf("kt_keys",{},[],"the key transparency log's public keys"),
 "kt_consistency":cf("kt_consistency",{"from":{"type":"integer","minimum":1},"to":{"type":"integer","minimum":1}},["from","to"],"a consistency proof between log sizes from and to"),
 "kt_leaves":cf("kt_leaves",{"from":SEQ,"limit":{"type":"integer","minimum":0,"maximum":1000}},[],"a page of the key transparency log's leaves"),
 "push_register":cf("push_register",{"push":ref("PushRegistration")},["push"],"register (or refresh) one of this device's push tokens"),
 "push_remove":cf("push_remove",{"push":ref("PushRegistration")},[],"remove one of this device's push tokens (push: provider and token or endpoint), or all of them (no push)"),
 "conv_info":cf("conv_info",{"conv_id":ref("ConvID")},["conv_id"],"read a conversation's conv frame"),
 "attachment_url":cf("attachment_url",{"conv_id":ref("ConvID"),"seq":{"type":"integer","minimum":1},"thumbnail":BOOL},["conv_id","seq"],"a download URL for the file (or thumbnail) of message seq"),
}
def name(prefix,t): return prefix+"".join(w.capitalize() for w in t.split("_"))
for t,s in server.items(): defs[name("S",t)]=s
for t,s in client.items(): defs[name("C",t)]=s
defs["ServerFrame"]={"description":"every frame the server sends; pick the branch by type",
  "oneOf":[ref(name("S",t)) for t in server]}
defs["ClientFrame"]={"description":"every frame a client may send","oneOf":[ref(name("C",t)) for t in client]}
doc={"$schema":"https://json-schema.org/draft/2020-12/schema",
 "title":"Parley wire protocol v1 frames",
 "description":"Generated by protocol/schema/gen.py from docs/protocol.md's tables; the e2e tests validate every frame the server sends against #/$defs/ServerFrame. Server frames are closed (no field outside the documented ones); clients must still ignore unknown fields, since the server may add optional ones within a version.",
 "oneOf":[ref("ServerFrame"),ref("ClientFrame")],"$defs":defs}
json.dump(doc, open("protocol/schema/frames.json","w"), indent=1)
open("protocol/schema/frames.json","a").write("\n")
