package protocol

import (
	"strings"
	"unicode"
)

// Bounds of the upload frames' fields.
const (
	MaxUploadParts      = 10000 // parts of one upload (S3's limit)
	MaxMediaTypeBytes   = 127
	MaxFileNameBytes    = 255
	sha256HexDigits     = 64
	attachmentIDMissing = "attachment_id is required"
)

// validateAttach checks the attachment frames' fields; what depends on the
// server's configuration (max_file_bytes, the parts of an upload) is the
// service's to check.
func validateAttach(f *Frame) *Error {
	switch f.Type {
	case TypeUploadCreate:
		if e := needConv(f); e != nil {
			return e
		}
		if f.Size < 0 {
			return Errorf(CodeInvalidArgument, "size must not be negative")
		}
		if !ValidSHA256(f.SHA256) {
			return Errorf(CodeInvalidArgument, "sha256 must be 64 lowercase hex digits")
		}
		if !ValidMediaType(f.MediaType) {
			return Errorf(CodeInvalidArgument, "media_type must be type/subtype, at most %d bytes of printable ASCII without spaces", MaxMediaTypeBytes)
		}
		if !ValidFileName(f.Name) {
			return Errorf(CodeInvalidArgument, "name must be 1-%d bytes without control characters, / or \\", MaxFileNameBytes)
		}
	case TypeUploadStatus, TypeUploadComplete:
		if f.AttachmentID == 0 {
			return Errorf(CodeInvalidArgument, attachmentIDMissing)
		}
	case TypeUploadPart:
		if f.AttachmentID == 0 {
			return Errorf(CodeInvalidArgument, attachmentIDMissing)
		}
		if f.Part < 1 || f.Part > MaxUploadParts {
			return Errorf(CodeInvalidArgument, "part must be 1..%d", MaxUploadParts)
		}
	case TypeAttachmentURL:
		if e := needConv(f); e != nil {
			return e
		}
		if f.Seq == 0 {
			return Errorf(CodeInvalidArgument, "seq is required")
		}
	}
	return nil
}

// ValidSHA256 reports whether s is a SHA-256 in lowercase hex.
func ValidSHA256(s string) bool {
	if len(s) != sha256HexDigits {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// ValidMediaType reports whether t is type/subtype (parameters allowed
// after the subtype): 1-127 bytes of printable ASCII without spaces, with
// something before and after the first slash.
func ValidMediaType(t string) bool {
	if len(t) == 0 || len(t) > MaxMediaTypeBytes {
		return false
	}
	for i := 0; i < len(t); i++ {
		if t[i] <= ' ' || t[i] >= 0x7f {
			return false
		}
	}
	a, b, ok := strings.Cut(t, "/")
	return ok && a != "" && b != ""
}

// ValidFileName reports whether n is a file name an upload may declare:
// 1-255 bytes of UTF-8 (the frame is valid UTF-8 already) without control
// characters, "/" or "\".
func ValidFileName(n string) bool {
	if len(n) == 0 || len(n) > MaxFileNameBytes {
		return false
	}
	for _, r := range n {
		if r == '/' || r == '\\' || unicode.IsControl(r) {
			return false
		}
	}
	return true
}
