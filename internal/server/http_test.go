package server

import (
	"net/url"
	"testing"

	"github.com/parley-im/parley/protocol"
)

func TestParseSnapshotQuery(t *testing.T) {
	tests := []struct {
		name  string
		query string
		want  []protocol.SyncConv
		all   bool
		code  protocol.Code
	}{
		{"one from for all", "conv_ids=1,2&from_seq=5", []protocol.SyncConv{{ConvID: 1, AfterSeq: 5}, {ConvID: 2, AfterSeq: 5}}, false, ""},
		{"from each", "conv_ids=1,2&from_seq=5,6", []protocol.SyncConv{{ConvID: 1, AfterSeq: 5}, {ConvID: 2, AfterSeq: 6}}, false, ""},
		{"no from", "conv_ids=9", []protocol.SyncConv{{ConvID: 9}}, false, ""},
		{"all only", "all=true", []protocol.SyncConv{}, true, ""},
		{"nothing", "", nil, false, protocol.CodeInvalidArgument},
		{"bad all", "all=yes", nil, false, protocol.CodeInvalidArgument},
		{"not a number", "conv_ids=1,x", nil, false, protocol.CodeInvalidArgument},
		{"negative", "conv_ids=-1", nil, false, protocol.CodeInvalidArgument},
		{"zero id", "conv_ids=0", nil, false, protocol.CodeInvalidArgument},
		{"repeated id", "conv_ids=3,3", nil, false, protocol.CodeInvalidArgument},
		{"from count", "conv_ids=1,2,3&from_seq=1,2", nil, false, protocol.CodeInvalidArgument},
		{"overflow", "conv_ids=18446744073709551616", nil, false, protocol.CodeInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q, _ := url.ParseQuery(tc.query)
			got, all, err := ParseSnapshotQuery(q, protocol.DefaultLimits)
			if tc.code != "" {
				if err == nil || err.Code != tc.code {
					t.Fatalf("got %v, want code %s", err, tc.code)
				}
				return
			}
			if err != nil || all != tc.all || len(got) != len(tc.want) {
				t.Fatalf("got %v all=%v err=%v, want %v all=%v", got, all, err, tc.want, tc.all)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("entry %d = %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// FuzzParseSnapshotQuery: any query string either fails with a documented
// code or yields distinct non-zero ids within the limit.
func FuzzParseSnapshotQuery(f *testing.F) {
	for _, s := range []string{"conv_ids=1,2&from_seq=5", "all=true", "conv_ids=&from_seq=", "conv_ids=1,1", "from_seq=1,2,3"} {
		f.Add(s)
	}
	lim := protocol.DefaultLimits
	lim.MaxSyncConvs = 50
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		got, all, perr := ParseSnapshotQuery(q, lim)
		if perr != nil {
			if perr.Code != protocol.CodeInvalidArgument && perr.Code != protocol.CodeTooLarge {
				t.Fatalf("undocumented code %s", perr.Code)
			}
			return
		}
		if len(got) == 0 && !all {
			t.Fatal("accepted a query that asks for nothing")
		}
		if len(got) > lim.MaxSyncConvs {
			t.Fatalf("%d conversations over the limit", len(got))
		}
		seen := map[uint64]bool{}
		for _, c := range got {
			if c.ConvID == 0 || seen[c.ConvID] {
				t.Fatalf("bad or repeated id %d", c.ConvID)
			}
			seen[c.ConvID] = true
		}
	})
}

func TestHTTPStatusOfEveryCode(t *testing.T) {
	want := map[protocol.Code]int{
		protocol.CodeBadFrame: 400, protocol.CodeUnknownType: 400, protocol.CodeInvalidArgument: 400,
		protocol.CodeUnauthorized: 401, protocol.CodeTokenExpired: 401,
		protocol.CodeNotMember: 403, protocol.CodeForbidden: 403, protocol.CodeNotFound: 404,
		protocol.CodeConflict: 409, protocol.CodeRecallExpired: 409, protocol.CodeTooLarge: 413,
		protocol.CodeRateLimited: 429, protocol.CodeStoreUnavailable: 503, protocol.CodeOverloaded: 503,
		protocol.CodeInternal: 500, protocol.CodeTimeout: 504,
		protocol.CodeE2ERequired: 400, protocol.CodeE2EUnsupported: 400, protocol.CodeBadKey: 400,
		protocol.CodeTokenRevoked: 401, protocol.CodeBanned: 403,
	}
	for code, status := range want {
		if got := httpStatus(code); got != status {
			t.Errorf("httpStatus(%s) = %d, want %d (docs/protocol.md)", code, got, status)
		}
	}
}
