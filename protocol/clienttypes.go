package protocol

// ClientTypes lists every frame type a client may send, the set the
// server's validation accepts and frames.json documents (the schema's tests
// compare the two). Metrics label received frames by these values; any other
// type shares one "unknown" series.
var ClientTypes = []string{
	TypePing, TypeSend, TypeEdit, TypeRecall, TypeReact, TypeDelivered, TypeRead,
	TypeSync, TypeHistory, TypeConvList, TypeOpenDirect, TypeCreateGroup,
	TypeAddMembers, TypeRemove, TypeLeave, TypeSetRole, TypeMute,
	TypePresenceSub, TypeTyping, TypeReadBy, TypeConvInfo,
	TypeKeysUpload, TypeKeysBundle, TypeKeysDevices, TypeKeysRemove,
	TypeKTKeys, TypeKTConsistency, TypeKTLeaves,
	TypePushRegister, TypePushRemove,
	TypeConvMute, TypeConvUnmute, TypeDNDSet, TypeDNDGet,
	TypeUploadCreate, TypeUploadStatus, TypeUploadPart, TypeUploadComplete, TypeAttachmentURL,
	TypeSearch,
}
