package e2ee

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
)

// Attachment encryption: Signal's attachment scheme, so that a file
// encrypted here opens with Signal's AttachmentCipherInputStream and the
// other way round. A fresh 64-byte key per file (AES-256 key ‖ HMAC-SHA256
// key); the plaintext is padded with zeros to a size bucket (PaddedSize),
// so that the server learns the size only to within 5%; the output is
// IV (16) ‖ AES-256-CBC with PKCS#7 ‖ HMAC-SHA256 of IV and ciphertext
// (32), and its SHA-256 is the digest the sender seals into the message
// (and the server checks as the upload's sha256). Both directions stream:
// encryption reads the plaintext once, decryption reads the ciphertext
// twice (once to check digest and MAC, once to decrypt) and releases no
// plaintext byte before both checks have passed.

// Sizes of the attachment format.
const (
	AttachmentKeySize    = 64 // AES-256 key ‖ HMAC-SHA256 key
	AttachmentDigestSize = sha256.Size
	attachIVSize         = aes.BlockSize
	attachMACSize        = sha256.Size
	// minPaddedSize is Signal's smallest bucket.
	minPaddedSize = 541
	// attachChunk is how much is read and encrypted at a time (a multiple
	// of the AES block).
	attachChunk = 64 << 10
)

// Errors of attachment decryption; nothing of the plaintext is written
// when one of them is returned.
var (
	// ErrAttachmentDigest: the ciphertext's SHA-256 is not the digest the
	// sender sealed (a changed, truncated or substituted file).
	ErrAttachmentDigest = errors.New("e2ee: attachment digest mismatch")
	// ErrAttachmentMAC: the HMAC does not verify under the key (a wrong
	// key, or a file forged to match a substituted digest).
	ErrAttachmentMAC = errors.New("e2ee: attachment MAC mismatch")
	// ErrAttachmentFormat: the ciphertext cannot be of this format (too
	// short, not whole blocks, bad PKCS#7 padding, a size beyond the
	// padded plaintext) or the key is not AttachmentKeySize bytes.
	ErrAttachmentFormat = errors.New("e2ee: malformed attachment")
)

// NewAttachmentKey returns a fresh random attachment key.
func NewAttachmentKey() []byte {
	k := make([]byte, AttachmentKeySize)
	_, _ = rand.Read(k) // crypto/rand.Read never fails on supported platforms
	return k
}

// PaddedSize is the size a plaintext of size bytes is padded to:
// max(541, floor(1.05^ceil(log(size)/log(1.05)))), Signal's buckets.
func PaddedSize(size int64) int64 {
	if size <= minPaddedSize {
		return minPaddedSize
	}
	p := int64(math.Floor(math.Pow(1.05, math.Ceil(math.Log(float64(size))/math.Log(1.05)))))
	return max(p, size) // never below the plaintext, whatever the rounding
}

// EncryptedSize is the size of the encryption of a size-byte plaintext:
// IV, the padded plaintext with its PKCS#7 block padding, MAC.
func EncryptedSize(size int64) int64 {
	return attachIVSize + (PaddedSize(size)/aes.BlockSize+1)*aes.BlockSize + attachMACSize
}

// EncryptAttachment writes the encryption of exactly size bytes read from
// r under key (AttachmentKeySize bytes, NewAttachmentKey) to w, and
// returns the digest (SHA-256 of everything written, EncryptedSize(size)
// bytes). r yielding fewer or more than size bytes is an error.
func EncryptAttachment(w io.Writer, r io.Reader, size int64, key []byte) ([]byte, error) {
	iv := make([]byte, attachIVSize)
	_, _ = rand.Read(iv)
	return encryptAttachment(w, r, size, key, iv)
}

func encryptAttachment(w io.Writer, r io.Reader, size int64, key, iv []byte) ([]byte, error) {
	if len(key) != AttachmentKeySize {
		return nil, fmt.Errorf("%w: key of %d bytes", ErrAttachmentFormat, len(key))
	}
	if size < 0 {
		return nil, fmt.Errorf("e2ee: attachment size %d", size)
	}
	block, err := aes.NewCipher(key[:32])
	if err != nil {
		return nil, err
	}
	enc := cipher.NewCBCEncrypter(block, iv)
	mac := hmac.New(sha256.New, key[32:])
	digest := sha256.New()
	out := io.MultiWriter(w, mac, digest)
	if _, err := out.Write(iv); err != nil {
		return nil, err
	}
	padded := PaddedSize(size)
	pkcs := aes.BlockSize - int(padded%aes.BlockSize)
	src := io.MultiReader(&exactReader{r: r, left: size}, io.LimitReader(zeros{}, padded-size), bytes.NewReader(bytes.Repeat([]byte{byte(pkcs)}, pkcs)))
	buf := make([]byte, attachChunk)
	for {
		n, err := io.ReadFull(src, buf)
		end := err == io.EOF || err == io.ErrUnexpectedEOF
		if err != nil && !end {
			return nil, err
		}
		if n > 0 {
			// Every chunk but the last is whole; the last ends with the
			// PKCS#7 padding, so it is whole blocks too.
			enc.CryptBlocks(buf[:n], buf[:n])
			if _, werr := out.Write(buf[:n]); werr != nil {
				return nil, werr
			}
		}
		if end {
			break
		}
	}
	if _, err := w.Write(mac.Sum(nil)); err != nil {
		return nil, err
	}
	digest.Write(mac.Sum(nil))
	return digest.Sum(nil), nil
}

// exactReader passes on exactly left bytes of r and fails when r has
// fewer, or more.
type exactReader struct {
	r    io.Reader
	left int64
}

func (e *exactReader) Read(p []byte) (int, error) {
	if e.left == 0 {
		var one [1]byte
		if n, _ := io.ReadFull(e.r, one[:]); n > 0 {
			return 0, errors.New("e2ee: attachment: the reader has more bytes than the size given")
		}
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if err == io.EOF && e.left > 0 {
		return n, fmt.Errorf("e2ee: attachment: the reader ended %d bytes short of the size given", e.left)
	}
	if err == io.EOF {
		err = nil
	}
	return n, err
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// VerifyAttachment checks a ciphertext of ctSize bytes in r against
// digest and key without decrypting it: SHA-256 of the whole, then the
// HMAC. DecryptAttachment calls it first.
func VerifyAttachment(r io.ReaderAt, ctSize int64, key, digest []byte) error {
	if len(key) != AttachmentKeySize {
		return fmt.Errorf("%w: key of %d bytes", ErrAttachmentFormat, len(key))
	}
	if len(digest) != AttachmentDigestSize {
		return fmt.Errorf("%w: digest of %d bytes", ErrAttachmentFormat, len(digest))
	}
	body := ctSize - attachIVSize - attachMACSize
	if body < aes.BlockSize || body%aes.BlockSize != 0 {
		return fmt.Errorf("%w: %d bytes", ErrAttachmentFormat, ctSize)
	}
	mac := hmac.New(sha256.New, key[32:])
	sum := sha256.New()
	if err := hashRange(r, 0, ctSize-attachMACSize, mac, sum); err != nil {
		return err
	}
	theirs := make([]byte, attachMACSize)
	if _, err := r.ReadAt(theirs, ctSize-attachMACSize); err != nil && !(err == io.EOF) {
		return fmt.Errorf("e2ee: attachment: %w", err)
	}
	sum.Write(theirs)
	if subtle.ConstantTimeCompare(sum.Sum(nil), digest) != 1 {
		return ErrAttachmentDigest
	}
	if !hmac.Equal(mac.Sum(nil), theirs) {
		return ErrAttachmentMAC
	}
	return nil
}

// hashRange feeds bytes [off, off+n) of r to every hash in hs.
func hashRange(r io.ReaderAt, off, n int64, hs ...hash.Hash) error {
	buf := make([]byte, attachChunk)
	for n > 0 {
		k := min(int64(len(buf)), n)
		got, err := r.ReadAt(buf[:k], off)
		if int64(got) < k {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("%w: %v", ErrAttachmentDigest, err)
		}
		for _, h := range hs {
			h.Write(buf[:got])
		}
		off, n = off+k, n-k
	}
	return nil
}

// DecryptAttachment checks the ciphertext of ctSize bytes in r against
// digest and key (VerifyAttachment) and only then decrypts it, writing the
// first size bytes of the plaintext (the rest is padding) to w. A digest,
// MAC or format failure returns before w gets a byte. r is read twice, so
// it must not change in between (a file this process wrote, or memory).
func DecryptAttachment(w io.Writer, r io.ReaderAt, ctSize int64, key, digest []byte, size int64) error {
	if err := VerifyAttachment(r, ctSize, key, digest); err != nil {
		return err
	}
	body := ctSize - attachIVSize - attachMACSize
	// The PKCS#7 padding takes 1 to 16 bytes: at most body-1 are plaintext.
	if size < 0 || size > body-1 {
		return fmt.Errorf("%w: size %d beyond the %d bytes encrypted", ErrAttachmentFormat, size, body)
	}
	iv := make([]byte, attachIVSize)
	if _, err := r.ReadAt(iv, 0); err != nil {
		return fmt.Errorf("e2ee: attachment: %w", err)
	}
	block, err := aes.NewCipher(key[:32])
	if err != nil {
		return err
	}
	dec := cipher.NewCBCDecrypter(block, iv)
	// The last block holds the PKCS#7 padding: decrypt it first, so that
	// a bad padding fails before any plaintext is written.
	last := make([]byte, 2*aes.BlockSize)
	lastOff := attachIVSize + body - int64(len(last))
	if body < int64(len(last)) {
		last = last[aes.BlockSize:]
		lastOff = attachIVSize
	}
	if _, err := r.ReadAt(last, lastOff); err != nil {
		return fmt.Errorf("e2ee: attachment: %w", err)
	}
	prev, tail := iv, last
	if len(last) == 2*aes.BlockSize {
		prev, tail = last[:aes.BlockSize], last[aes.BlockSize:]
	}
	plainLast := make([]byte, aes.BlockSize)
	cipher.NewCBCDecrypter(block, prev).CryptBlocks(plainLast, tail)
	pad := int(plainLast[aes.BlockSize-1])
	if pad < 1 || pad > aes.BlockSize || subtle.ConstantTimeCompare(plainLast[aes.BlockSize-pad:], bytes.Repeat([]byte{byte(pad)}, pad)) != 1 {
		return fmt.Errorf("%w: bad padding", ErrAttachmentFormat)
	}
	if size > body-int64(pad) {
		return fmt.Errorf("%w: size %d beyond the %d bytes of plaintext", ErrAttachmentFormat, size, body-int64(pad))
	}
	buf := make([]byte, attachChunk)
	off, left := int64(attachIVSize), size
	for left > 0 {
		k := min(int64(len(buf)), (left+aes.BlockSize-1)/aes.BlockSize*aes.BlockSize)
		if got, err := r.ReadAt(buf[:k], off); int64(got) < k {
			return fmt.Errorf("e2ee: attachment: read at %d: %w", off, err)
		}
		dec.CryptBlocks(buf[:k], buf[:k])
		n := min(k, left)
		if _, err := w.Write(buf[:n]); err != nil {
			return err
		}
		off, left = off+k, left-n
	}
	return nil
}
