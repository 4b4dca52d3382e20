package e2ee

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// signalBuckets is Signal's published table of padding buckets (the
// BUCKET_SIZES of Signal-Desktop's logPadding test): every padded size up
// to about 100 MiB.
var signalBuckets = []int64{
	541, 568, 596, 626, 657, 690, 725, 761, 799, 839, 881, 925, 972, 1020, 1071,
	1125, 1181, 1240, 1302, 1367, 1436, 1507, 1583, 1662, 1745, 1832, 1924, 2020,
	2121, 2227, 2339, 2456, 2579, 2708, 2843, 2985, 3134, 3291, 3456, 3629, 3810,
	4001, 4201, 4411, 4631, 4863, 5106, 5361, 5629, 5911, 6207, 6517, 6843, 7185,
	7544, 7921, 8318, 8733, 9170, 9629, 10110, 10616, 11146, 11704, 12289, 12903,
	13549, 14226, 14937, 15684, 16469, 17292, 18157, 19065, 20018, 21019, 22070,
	23173, 24332, 25549, 26826, 28167, 29576, 31054, 32607, 34238, 35950, 37747,
	39634, 41616, 43697, 45882, 48176, 50585, 53114, 55770, 58558, 61486, 64561,
	67789, 71178, 74737, 78474, 82398, 86518, 90843, 95386, 100155, 105163,
	110421, 115942, 121739, 127826, 134217, 140928, 147975, 155373, 163142,
	171299, 179864, 188858, 198300, 208215, 218626, 229558, 241036, 253087,
	265742, 279029, 292980, 307629, 323011, 339161, 356119, 373925, 392622,
	412253, 432866, 454509, 477234, 501096, 526151, 552458, 580081, 609086,
	639540, 671517, 705093, 740347, 777365, 816233, 857045, 899897, 944892,
	992136, 1041743, 1093831, 1148522, 1205948, 1266246, 1329558, 1396036,
	1465838, 1539130, 1616086, 1696890, 1781735, 1870822, 1964363, 2062581,
	2165710, 2273996, 2387695, 2507080, 2632434, 2764056, 2902259, 3047372,
	3199740, 3359727, 3527714, 3704100, 3889305, 4083770, 4287958, 4502356,
	4727474, 4963848, 5212040, 5472642, 5746274, 6033588, 6335268, 6652031,
	6984633, 7333864, 7700558, 8085585, 8489865, 8914358, 9360076, 9828080,
	10319484, 10835458, 11377231, 11946092, 12543397, 13170567, 13829095,
	14520550, 15246578, 16008907, 16809352, 17649820, 18532311, 19458926,
	20431872, 21453466, 22526139, 23652446, 24835069, 26076822, 27380663,
	28749697, 30187181, 31696540, 33281368, 34945436, 36692708, 38527343,
	40453710, 42476396, 44600216, 46830227, 49171738, 51630325, 54211841,
	56922433, 59768555, 62756983, 65894832, 69189573, 72649052, 76281505,
	80095580, 84100359, 88305377, 92720646, 97356678, 102224512, 107335738,
}

// TestPaddedSizeSignalBuckets checks PaddedSize against Signal's tables:
// each bucket, one below and one above it (Signal-Desktop's logPadding
// test), and Signal-iOS's spot checks (CryptographyTestsSwift).
func TestPaddedSizeSignalBuckets(t *testing.T) {
	for size := int64(0); size <= 541; size++ {
		if got := PaddedSize(size); got != 541 {
			t.Fatalf("PaddedSize(%d) = %d, want 541", size, got)
		}
	}
	for i, b := range signalBuckets[:len(signalBuckets)-1] {
		for _, c := range []struct{ size, want int64 }{{b, b}, {b - 1, b}, {b + 1, signalBuckets[i+1]}} {
			if got := PaddedSize(c.size); got != c.want {
				t.Errorf("PaddedSize(%d) = %d, want %d", c.size, got, c.want)
			}
		}
	}
	for _, c := range []struct{ size, want int64 }{
		{1, 541}, {12, 541}, {123, 541}, {1_234, 1_240}, {12_345, 12_903}, {123_456, 127_826},
		{1_234_567, 1_266_246}, {12_345_678, 12_543_397}, {123_456_789, 124_254_533},
		{92_720_647, 97_356_678}, {97_356_677, 97_356_678},
	} {
		if got := PaddedSize(c.size); got != c.want {
			t.Errorf("PaddedSize(%d) = %d, want %d", c.size, got, c.want)
		}
	}
}

// referenceEncrypt builds the format from its definition, in memory, with
// nothing shared with the streaming code: zero padding to the bucket,
// PKCS#7, CBC, HMAC over IV ‖ ciphertext.
func referenceEncrypt(plain, key, iv []byte) (out, digest []byte) {
	padded := append(bytes.Clone(plain), make([]byte, PaddedSize(int64(len(plain)))-int64(len(plain)))...)
	pad := aes.BlockSize - len(padded)%aes.BlockSize
	padded = append(padded, bytes.Repeat([]byte{byte(pad)}, pad)...)
	block, _ := aes.NewCipher(key[:32])
	ct := make([]byte, len(padded))
	cipher.NewCBCEncrypter(block, iv).CryptBlocks(ct, padded)
	out = append(append(bytes.Clone(iv), ct...), hmacSHA256(key[32:], iv, ct)...)
	d := sha256.Sum256(out)
	return out, d[:]
}

func randBytes(r *rand.ChaCha8, n int) []byte {
	b := make([]byte, n)
	r.Read(b)
	return b
}

func TestAttachmentRoundTripAndFormat(t *testing.T) {
	rng := rand.NewChaCha8([32]byte{7})
	for _, size := range []int{0, 1, 15, 16, 17, 540, 541, 542, 543, 4095, 4096, attachChunk - 1, attachChunk, attachChunk + 1, 3*attachChunk + 5, 1<<20 + 3} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			plain := randBytes(rng, size)
			key, iv := randBytes(rng, AttachmentKeySize), randBytes(rng, 16)
			var ct bytes.Buffer
			digest, err := encryptAttachment(&ct, bytes.NewReader(plain), int64(size), key, iv)
			if err != nil {
				t.Fatal(err)
			}
			want, wantDigest := referenceEncrypt(plain, key, iv)
			if !bytes.Equal(ct.Bytes(), want) || !bytes.Equal(digest, wantDigest) {
				t.Fatalf("ciphertext of %d bytes differs from the format's definition (%d bytes, want %d)", size, ct.Len(), len(want))
			}
			if int64(ct.Len()) != EncryptedSize(int64(size)) {
				t.Fatalf("EncryptedSize(%d) = %d, the ciphertext has %d", size, EncryptedSize(int64(size)), ct.Len())
			}
			var got bytes.Buffer
			if err := DecryptAttachment(&got, bytes.NewReader(ct.Bytes()), int64(ct.Len()), key, digest, int64(size)); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), plain) {
				t.Fatalf("decrypted %d bytes, not the plaintext of %d", got.Len(), size)
			}
		})
	}
	// Two encryptions of one file differ (fresh IV) with one key.
	key := NewAttachmentKey()
	var a, b bytes.Buffer
	da, _ := EncryptAttachment(&a, bytes.NewReader([]byte("same")), 4, key)
	db, _ := EncryptAttachment(&b, bytes.NewReader([]byte("same")), 4, key)
	if bytes.Equal(a.Bytes(), b.Bytes()) || bytes.Equal(da, db) {
		t.Fatal("two encryptions of one plaintext are equal")
	}
}

func TestEncryptAttachmentSizeMustMatch(t *testing.T) {
	key := NewAttachmentKey()
	var out bytes.Buffer
	if _, err := EncryptAttachment(&out, bytes.NewReader(make([]byte, 10)), 11, key); err == nil {
		t.Fatal("a reader shorter than the size was encrypted")
	}
	if _, err := EncryptAttachment(&out, bytes.NewReader(make([]byte, 12)), 11, key); err == nil {
		t.Fatal("a reader longer than the size was encrypted")
	}
	if _, err := EncryptAttachment(&out, bytes.NewReader(nil), 0, key[:32]); !errors.Is(err, ErrAttachmentFormat) {
		t.Fatalf("a 32-byte key: %v", err)
	}
}

// countWriter counts what reaches it: a failed decryption must write
// nothing.
type countWriter struct{ n int }

func (c *countWriter) Write(p []byte) (int, error) { c.n += len(p); return len(p), nil }

func TestDecryptAttachmentRefusesTampering(t *testing.T) {
	plain := bytes.Repeat([]byte("attack at dawn. "), 5000)
	key := NewAttachmentKey()
	var buf bytes.Buffer
	digest, err := EncryptAttachment(&buf, bytes.NewReader(plain), int64(len(plain)), key)
	if err != nil {
		t.Fatal(err)
	}
	ct := buf.Bytes()
	size := int64(len(plain))
	flip := func(i int) []byte { b := bytes.Clone(ct); b[i] ^= 1; return b }
	otherKey := NewAttachmentKey()
	// A forger who changes the file and sets the digest to match still
	// fails the MAC.
	forged := flip(100)
	forgedDigest := sha256.Sum256(forged)
	wrongSize := func(n int64) error {
		return DecryptAttachment(&countWriter{}, bytes.NewReader(ct), int64(len(ct)), key, digest, n)
	}
	cases := []struct {
		name   string
		ct     []byte
		key    []byte
		digest []byte
		size   int64
		want   error
	}{
		{"flipped IV bit", flip(3), key, digest, size, ErrAttachmentDigest},
		{"flipped ciphertext bit", flip(len(ct) / 2), key, digest, size, ErrAttachmentDigest},
		{"flipped MAC bit", flip(len(ct) - 1), key, digest, size, ErrAttachmentDigest},
		{"truncated by a block", ct[:len(ct)-16], key, digest, size, ErrAttachmentDigest},
		{"truncated to nothing", nil, key, digest, size, ErrAttachmentFormat},
		{"extended", append(bytes.Clone(ct), make([]byte, 16)...), key, digest, size, ErrAttachmentDigest},
		{"wrong digest", ct, key, bytes.Repeat([]byte{1}, 32), size, ErrAttachmentDigest},
		{"wrong key", ct, otherKey, digest, size, ErrAttachmentMAC},
		{"forged with its digest", forged, key, forgedDigest[:], size, ErrAttachmentMAC},
		{"short key", ct, key[:32], digest, size, ErrAttachmentFormat},
		{"short digest", ct, key, digest[:16], size, ErrAttachmentFormat},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := &countWriter{}
			err := DecryptAttachment(w, bytes.NewReader(c.ct), int64(len(c.ct)), c.key, c.digest, c.size)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if w.n != 0 {
				t.Fatalf("%d plaintext bytes written before the error", w.n)
			}
		})
	}
	// A size the ciphertext cannot hold (beyond the padded plaintext) is
	// refused; any size within the padding is the sender's word.
	if err := wrongSize(PaddedSize(size) + 1); !errors.Is(err, ErrAttachmentFormat) {
		t.Fatalf("size beyond the padded plaintext: %v", err)
	}
	if err := wrongSize(-1); !errors.Is(err, ErrAttachmentFormat) {
		t.Fatalf("negative size: %v", err)
	}
}

// TestDecryptAttachmentBadPaddingWritesNothing: a ciphertext whose MAC and
// digest are right (made with the key) but whose PKCS#7 padding is wrong
// is refused before any plaintext is written.
func TestDecryptAttachmentBadPaddingWritesNothing(t *testing.T) {
	key := NewAttachmentKey()
	iv := make([]byte, 16)
	plain := make([]byte, 64) // ends in 0x00: not a PKCS#7 padding
	block, _ := aes.NewCipher(key[:32])
	ct := make([]byte, len(plain))
	cipher.NewCBCEncrypter(block, iv).CryptBlocks(ct, plain)
	m := hmac.New(sha256.New, key[32:])
	m.Write(iv)
	m.Write(ct)
	out := append(append(iv, ct...), m.Sum(nil)...)
	d := sha256.Sum256(out)
	w := &countWriter{}
	if err := DecryptAttachment(w, bytes.NewReader(out), int64(len(out)), key, d[:], 10); !errors.Is(err, ErrAttachmentFormat) || w.n != 0 {
		t.Fatalf("bad padding: err %v, %d bytes written", err, w.n)
	}
}

func TestPaddedSizeNeverBelowSize(t *testing.T) {
	for _, s := range []int64{541, 542, 1 << 20, 100 << 20, 1<<40 + 1, math.MaxInt32} {
		if p := PaddedSize(s); p < s {
			t.Fatalf("PaddedSize(%d) = %d", s, p)
		}
	}
}
