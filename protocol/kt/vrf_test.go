package kt

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"

	"filippo.io/edwards25519"
)

// RFC 9381 Appendix B.3, Examples 16–18 (ECVRF-EDWARDS25519-SHA512-TAI),
// with the intermediate values the RFC prints: H, k (reduced), U = k*B,
// V = k*H.
var vrfVectors = []struct {
	name          string
	sk, pk, alpha string
	h, k, u, v    string
	pi, beta      string
}{
	{
		name:  "example16",
		sk:    "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
		pk:    "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
		alpha: "",
		h:     "91bbed02a99461df1ad4c6564a5f5d829d0b90cfc7903e7a5797bd658abf3318",
		k:     "8a49edbd1492a8ee09766befe50a7d563051bf3406cbffc20a88def030730f0f",
		u:     "aef27c725be964c6a9bf4c45ca8e35df258c1878b838f37d9975523f09034071",
		v:     "5016572f71466c646c119443455d6cb9b952f07d060ec8286d678615d55f954f",
		pi: "8657106690b5526245a92b003bb079ccd1a92130477671f6fc01ad16f26f723f" +
			"26f8a57ccaed74ee1b190bed1f479d9727d2d0f9b005a6e456a35d4fb0daab12" +
			"68a1b0db10836d9826a528ca76567805",
		beta: "90cf1df3b703cce59e2a35b925d411164068269d7b2d29f3301c03dd757876ff" +
			"66b71dda49d2de59d03450451af026798e8f81cd2e333de5cdf4f3e140fdd8ae",
	},
	{
		name:  "example17",
		sk:    "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
		pk:    "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
		alpha: "72",
		h:     "5b659fc3d4e9263fd9a4ed1d022d75eaacc20df5e09f9ea937502396598dc551",
		k:     "d8c3a66921444cb3427d5d989f9b315aa8ca3375e9ec4d52207711a1fdb44107",
		u:     "1dcb0a4821a2c48bf53548228b7f170962988f6d12f5439f31987ef41f034ab3",
		v:     "fd03c0bf498c752161bae4719105a074630a2aa5f200ff7b3995f7bfb1513423",
		pi: "f3141cd382dc42909d19ec5110469e4feae18300e94f304590abdced48aed593" +
			"3bf0864a62558b3ed7f2fea45c92a465301b3bbf5e3e54ddf2d935be3b67926d" +
			"a3ef39226bbc355bdc9850112c8f4b02",
		beta: "eb4440665d3891d668e7e0fcaf587f1b4bd7fbfe99d0eb2211ccec90496310eb" +
			"5e33821bc613efb94db5e5b54c70a848a0bef4553a41befc57663b56373a5031",
	},
	{
		name:  "example18",
		sk:    "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
		pk:    "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
		alpha: "af82",
		h:     "bf4339376f5542811de615e3313d2b36f6f53c0acfebb482159711201192576a",
		k:     "5ffdbc72135d936014e8ab708585fda379405542b07e3bd2c0bd48437fbac60a",
		u:     "2bae73e15a64042fcebf062abe7e432b2eca6744f3e8265bc38e009cd577ecd5",
		v:     "88cba1cb0d4f9b649d9a86026b69de076724a93a65c349c988954f0961c5d506",
		pi: "9bc0f79119cc5604bf02d23b4caede71393cedfbb191434dd016d30177ccbf80" +
			"96bb474e53895c362d8628ee9f9ea3c0e52c7a5c691b6c18c9979866568add7a" +
			"2d41b00b05081ed0f58ee5e31b3a970e",
		beta: "645427e5d00c62a23fb703732fa5d892940935942101e456ecca7bb217c61c45" +
			"2118fec1219202a0edcf038bb6373241578be7217ba85a2687f7a0310b2df19f",
	},
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestVRFVectors(t *testing.T) {
	for _, v := range vrfVectors {
		t.Run(v.name, func(t *testing.T) {
			k, err := NewVRFPrivateKey(unhex(t, v.sk))
			if err != nil {
				t.Fatal(err)
			}
			pk := k.Public()
			if got := hex.EncodeToString(pk[:]); got != v.pk {
				t.Fatalf("public key %s, want %s", got, v.pk)
			}
			alpha := unhex(t, v.alpha)

			h, err := encodeToCurve(pk[:], alpha)
			if err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(h.Bytes()); got != v.h {
				t.Errorf("H %s, want %s", got, v.h)
			}
			kn := nonce(k.nonceKey[:], h.Bytes())
			if got := hex.EncodeToString(kn.Bytes()); got != v.k {
				t.Errorf("k %s, want %s", got, v.k)
			}
			if got := hex.EncodeToString(new(edwards25519.Point).ScalarBaseMult(kn).Bytes()); got != v.u {
				t.Errorf("U %s, want %s", got, v.u)
			}
			if got := hex.EncodeToString(new(edwards25519.Point).ScalarMult(kn, h).Bytes()); got != v.v {
				t.Errorf("V %s, want %s", got, v.v)
			}

			beta, proof := k.Prove(alpha)
			if got := hex.EncodeToString(proof); got != v.pi {
				t.Errorf("pi %s, want %s", got, v.pi)
			}
			if got := hex.EncodeToString(beta[:]); got != v.beta {
				t.Errorf("beta %s, want %s", got, v.beta)
			}

			var pub VRFPublicKey
			copy(pub[:], unhex(t, v.pk))
			got, err := pub.Verify(alpha, unhex(t, v.pi))
			if err != nil {
				t.Fatalf("Verify of the RFC's proof: %v", err)
			}
			if hex.EncodeToString(got[:]) != v.beta {
				t.Errorf("Verify beta %x, want %s", got, v.beta)
			}
		})
	}
}

func TestVRFRefuses(t *testing.T) {
	v := vrfVectors[1]
	var pk VRFPublicKey
	copy(pk[:], unhex(t, v.pk))
	alpha := unhex(t, v.alpha)
	pi := unhex(t, v.pi)
	var other VRFPublicKey
	copy(other[:], unhex(t, vrfVectors[2].pk))

	flip := func(i int) []byte {
		b := bytes.Clone(pi)
		b[i] ^= 0x01
		return b
	}
	// s + l: the same scalar, not canonical.
	nonCanonicalS := bytes.Clone(pi)
	addOrder(nonCanonicalS[48:])
	// The identity point (y = 1), of small order, as a public key.
	var identity VRFPublicKey
	identity[0] = 1
	// y = p (non-canonical encoding of y = 0, a point on the curve).
	nonCanonicalGamma := bytes.Clone(pi)
	copy(nonCanonicalGamma[:32], unhex(t, "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"))

	cases := []struct {
		name  string
		pk    VRFPublicKey
		alpha []byte
		proof []byte
	}{
		{"gamma bit", pk, alpha, flip(0)},
		{"challenge bit", pk, alpha, flip(32)},
		{"s bit", pk, alpha, flip(79)},
		{"s not canonical", pk, alpha, nonCanonicalS},
		{"gamma not canonical", pk, alpha, nonCanonicalGamma},
		{"other alpha", pk, append(bytes.Clone(alpha), 0), pi},
		{"other key", other, alpha, pi},
		{"small-order key", identity, alpha, pi},
		{"short", pk, alpha, pi[:79]},
		{"long", pk, alpha, append(bytes.Clone(pi), 0)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := c.pk.Verify(c.alpha, c.proof); !errors.Is(err, ErrVRF) {
				t.Fatalf("Verify: %v, want ErrVRF", err)
			}
		})
	}
}

// addOrder adds the group order l to a 32-byte little-endian scalar below
// 2^253 - l (the RFC's s values are).
func addOrder(s []byte) {
	l := [32]byte{0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde, 0x14,
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10}
	carry := 0
	for i := range 32 {
		sum := int(s[i]) + int(l[i]) + carry
		s[i] = byte(sum)
		carry = sum >> 8
	}
}

func TestLabel(t *testing.T) {
	k, err := GenerateVRFKey()
	if err != nil {
		t.Fatal(err)
	}
	label, proof := LabelFor(k, "alice")
	got, err := k.Public().VerifyLabel("alice", proof)
	if err != nil || got != label {
		t.Fatalf("VerifyLabel = %x, %v; want %x", got, err, label)
	}
	if _, err := k.Public().VerifyLabel("bob", proof); !errors.Is(err, ErrVRF) {
		t.Fatalf("alice's proof for bob: %v, want ErrVRF", err)
	}
	label2, _ := LabelFor(k, "alice")
	if label2 != label {
		t.Fatal("the label of a user is not deterministic")
	}
	k2, err := NewVRFPrivateKey(k.Seed())
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := LabelFor(k2, "alice"); l != label {
		t.Fatal("a key rebuilt from its seed gives another label")
	}
	if _, err := NewVRFPrivateKey(make([]byte, 31)); err == nil {
		t.Fatal("a 31-byte seed was accepted")
	}
}

func TestDecodePointStrict(t *testing.T) {
	for _, enc := range []string{
		// y = p: y = 0 written non-canonically.
		"edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
		// y = 1 (x = 0) with the sign bit set.
		"0100000000000000000000000000000000000000000000000000000000000080",
	} {
		b := unhex(t, enc)
		if _, err := new(edwards25519.Point).SetBytes(b); err != nil {
			t.Fatalf("%s: not a point at all (%v): the case tests nothing", enc, err)
		}
		if _, err := decodePoint(b); err == nil {
			t.Errorf("%s: a non-canonical encoding decoded", enc)
		}
	}
}
