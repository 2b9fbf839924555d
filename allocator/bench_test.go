package allocator_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/poolalloc/poolalloc/algorithm"
	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/syncer"
)

// The benchmarks run rounds through controller-runtime's fake client, so
// each write's cost includes the fake server's JSON patch handling; the
// allocator's own share is what grows, or not, with the pool.

// benchPool is a steady pool: pods Ready pods, claims of podsPerClaim pods
// holding 80% of them, all recorded on a fake API server and recovered by
// the allocator.
type benchPool struct {
	c    client.Client
	a    allocator.Allocator
	pool types.NamespacedName
	in   allocator.Input
	next int // claims created so far
	free int // pods still free
	per  int
	// place places claim k (from 0), nil for none (newBenchPoolPlaced).
	place func(k int) algorithm.Placement
}

func readyPod(ns, name string) corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: "1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue},
		}},
	}
}

func newBenchPool(b *testing.B, pods, per int, opts ...allocator.Option) *benchPool {
	b.Helper()
	return newBenchPoolHeld(b, pods, per, pods*8/10, opts...)
}

// The benchmarks measure the record path: their pods live only in the round
// input, not on the fake server, so pod marks (one more pod patch per pod
// handed out) are off.
// benchOpts measure the allocator as shipped: the per-call self-check,
// on by default in test binaries, is off (BenchmarkRoundChecked measures
// it).
var benchOpts = []allocator.Option{allocator.WithPodMarks(false), allocator.WithInvariantChecks(false)}

// newBenchPoolHeld is newBenchPool with held pods held.
func newBenchPoolHeld(b *testing.B, pods, per, held int, opts ...allocator.Option) *benchPool {
	b.Helper()
	return newBenchPoolPlaced(b, pods, per, held, nil, opts...)
}

// benchClasses is the number of pod classes of a placed bench pool.
const benchClasses = 10

// spreadPlacement places bench claim k: pods of class k mod benchClasses,
// spread over three zones.
func spreadPlacement(k int) algorithm.Placement {
	class := strconv.Itoa(k % benchClasses)
	return algorithm.Placement{
		Selector: labels.SelectorFromSet(labels.Set{"class": class}),
		Class:    class,
		Topology: algorithm.Topology{Mode: algorithm.TopologySpread, Key: algorithm.ZoneKey},
	}
}

// gangPlacement places a bench claim as a gang.
func gangPlacement(int) algorithm.Placement { return algorithm.Placement{Gang: true} }

// newBenchPoolPlaced is newBenchPoolHeld whose claims are placed by place
// (by claim number, from 0), if not nil: then pod i is labelled class
// (i/per) mod benchClasses, so that each claim holds pods of its class,
// and is in zone i mod 3.
func newBenchPoolPlaced(b *testing.B, pods, per, held int, place func(k int) algorithm.Placement, opts ...allocator.Option) *benchPool {
	b.Helper()
	scheme, err := testenv.NewScheme()
	if err != nil {
		b.Fatal(err)
	}
	const ns = "bench"
	bp := &benchPool{pool: types.NamespacedName{Namespace: ns, Name: "p"}, per: per}
	bp.in.Pool = bp.pool
	bp.place = place
	for i := range pods {
		pod := readyPod(ns, "p-"+strconv.Itoa(i))
		if place != nil {
			pod.Labels = map[string]string{"class": strconv.Itoa(i / per % benchClasses), allocator.ZoneLabel: "zone-" + strconv.Itoa(i%3)}
		}
		bp.in.Pods = append(bp.in.Pods, pod)
	}
	objs := make([]client.Object, 0, held/per)
	keys := syncer.DefaultKeys()
	for i := 0; i+per <= held; i += per {
		names := make([]string, per)
		for j := range per {
			names[j] = "p-" + strconv.Itoa(i+j)
		}
		v, err := syncer.EncodePods(names)
		if err != nil {
			b.Fatal(err)
		}
		cl := bp.newClaim()
		cl.Annotations = map[string]string{keys.Allocated: v}
		cl.Finalizers = []string{keys.Finalizer}
		objs = append(objs, cl)
	}
	// A plain object tracker: the default one also maintains managed
	// fields, which triples the cost of every fake write and is not what
	// is measured here.
	tracker := clienttesting.NewObjectTracker(scheme, serializer.NewCodecFactory(scheme).UniversalDecoder())
	bp.c = fake.NewClientBuilder().WithGlobalResourceVersionCounter().WithScheme(scheme).WithObjectTracker(tracker).WithObjects(objs...).Build()
	for _, o := range objs {
		// Read back for the resourceVersion the fake server gave it.
		cl := &testenv.Claim{}
		if err := bp.c.Get(context.Background(), client.ObjectKeyFromObject(o), cl); err != nil {
			b.Fatal(err)
		}
		bp.in.Claims = append(bp.in.Claims, bp.claim(cl, len(bp.in.Claims)))
	}
	bp.free = pods - len(objs)*per
	bp.a, err = allocator.New(bp.c, append(slices.Clone(benchOpts), opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := bp.a.Round(context.Background(), bp.in); err != nil {
		b.Fatal(err)
	}
	return bp
}

func (bp *benchPool) newClaim() *testenv.Claim {
	bp.next++
	name := fmt.Sprintf("c-%d", bp.next)
	cl := testenv.NewClaim(bp.pool.Namespace, name, bp.pool.Name, int32(bp.per))
	cl.UID = types.UID("uid-" + name)
	cl.CreationTimestamp = metav1.NewTime(time.Unix(int64(bp.next), 0))
	return cl
}

// addClaim creates one new claim on the fake server and returns it as
// round input.
func (bp *benchPool) addClaim(b *testing.B) allocator.Claim {
	cl := bp.newClaim()
	if err := bp.c.Create(context.Background(), cl); err != nil {
		b.Fatal(err)
	}
	return bp.claim(cl, bp.next-1)
}

// claim is cl, claim k (from 0), as round input, placed if the pool
// places its claims.
func (bp *benchPool) claim(cl *testenv.Claim, k int) allocator.Claim {
	c := allocator.Claim{Object: cl, Want: bp.per}
	if bp.place != nil {
		c.Placement = bp.place(k)
	}
	return c
}

func benchSizes(b *testing.B, f func(b *testing.B, pods int)) {
	for _, pods := range []int{1000, 10000, 50000} {
		b.Run("pods="+strconv.Itoa(pods), func(b *testing.B) { f(b, pods) })
	}
}

// BenchmarkRoundFullListing is one round with one new claim, given the
// whole pool as input (Round).
func BenchmarkRoundFullListing(b *testing.B) {
	benchSizes(b, func(b *testing.B, pods int) {
		listingRounds(b, pods, false, func(in allocator.Input) allocator.Input { return in })
	})
}

// listingRounds runs b.N rounds on a pool of pods, each with one new
// claim, given the whole pool as input: the listing listing makes of the
// pool's input, out of the timer. With recovered, the allocator of each
// new pool is a new one that recovered the pool from listing's listing
// (as an operator's allocator recovers from its cache), not from the
// pool's input.
func listingRounds(b *testing.B, pods int, recovered bool, listing func(allocator.Input) allocator.Input) {
	var bp *benchPool
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if bp == nil || bp.free < bp.per {
			bp = newBenchPool(b, pods, 1)
			if recovered {
				a, err := allocator.New(bp.c, benchOpts...)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := a.Round(context.Background(), listing(bp.in)); err != nil {
					b.Fatal(err)
				}
				bp.a = a
			}
		}
		bp.in.Claims = append(bp.in.Claims, bp.addClaim(b))
		bp.free -= bp.per
		in := listing(bp.in)
		b.StartTimer()
		res, err := bp.a.Round(context.Background(), in)
		if err != nil || len(res.Allocated) != 1 {
			b.Fatalf("round: %v, %d grants", err, len(res.Allocated))
		}
	}
}

// BenchmarkReadListing is the floor under BenchmarkRoundFullListing: the
// same pools and the same work between iterations, but each iteration only
// reads what any round must read of a full listing (each pod's name,
// namespace, UID and resourceVersion, each claim's UID and
// resourceVersion) and compares it with a copy kept from the first
// iteration, as a lookup in the allocator's state would. Run the two in
// one go and compare their medians:
//
//	go test ./allocator -run '^$' -bench 'BenchmarkRoundFullListing$|BenchmarkReadListing$' -benchtime 100x -count 5
func BenchmarkReadListing(b *testing.B) {
	type head struct{ name, ns, uid, rv string }
	benchSizes(b, func(b *testing.B, pods int) {
		var bp *benchPool
		var kept []head
		same := 0
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			if bp == nil || bp.free < bp.per {
				bp = newBenchPool(b, pods, 1)
				kept = nil
			}
			bp.in.Claims = append(bp.in.Claims, bp.addClaim(b))
			bp.free -= bp.per
			if kept == nil {
				for j := range bp.in.Pods {
					m := &bp.in.Pods[j].ObjectMeta
					kept = append(kept, head{m.Name, m.Namespace, string(m.UID), m.ResourceVersion})
				}
				for _, c := range bp.in.Claims {
					kept = append(kept, head{uid: string(c.Object.GetUID()), rv: c.Object.GetResourceVersion()})
				}
			}
			b.StartTimer()
			for j := range bp.in.Pods {
				m, k := &bp.in.Pods[j].ObjectMeta, &kept[j]
				if m.Name == k.name && m.Namespace == k.ns && string(m.UID) == k.uid && m.ResourceVersion == k.rv {
					same++
				}
			}
			for j, c := range bp.in.Claims {
				if j := len(bp.in.Pods) + j; j < len(kept) && string(c.Object.GetUID()) == kept[j].uid && c.Object.GetResourceVersion() == kept[j].rv {
					same++
				}
			}
		}
		if same == 0 {
			b.Fatal("nothing compared equal")
		}
	})
}

// BenchmarkRoundShuffledListing is BenchmarkRoundFullListing with the
// pods and claims listed in a new order every round, the claims' objects
// where they were made (as a caller that passes a cache's own objects
// gives them; BenchmarkRoundCacheListing copies them as a cache's List
// does).
func BenchmarkRoundShuffledListing(b *testing.B) {
	benchSizes(b, func(b *testing.B, pods int) {
		rnd := rand.New(rand.NewPCG(1, 2))
		listingRounds(b, pods, false, func(in allocator.Input) allocator.Input {
			rnd.Shuffle(len(in.Pods), func(i, j int) { in.Pods[i], in.Pods[j] = in.Pods[j], in.Pods[i] })
			rnd.Shuffle(len(in.Claims), func(i, j int) { in.Claims[i], in.Claims[j] = in.Claims[j], in.Claims[i] })
			return in
		})
	})
}

// BenchmarkRoundCacheListing compares Round on the same listing in three
// orders, each made as controller-runtime's cache List makes it for an
// operator (examples/operator lists its pools so): every pod and claim a
// deep copy in a fresh list (the strings are the cached objects'). The
// orders: name order (order=fixed); the order of an informer's indexer
// holding the pods and the claims, which controller-runtime's List of a
// namespace reads through the indexer's namespace index, a Go map, and so
// gets in that map's order (order=cache, what an operator gets); and a new
// random order every round (order=random, which no cache gives: a map's
// order changes little from one iteration to the next). The garbage of
// the copies is collected before the round is timed, in all three.
// BenchmarkRoundShuffledListing is the harder case of claims whose objects
// stay where they were made, in no order (a caller that passes the
// cache's own objects).
func BenchmarkRoundCacheListing(b *testing.B) {
	benchSizes(b, func(b *testing.B, pods int) {
		for _, order := range []string{"fixed", "cache", "relisted", "random"} {
			b.Run("order="+order, func(b *testing.B) {
				rnd := rand.New(rand.NewPCG(1, 2))
				var inf informerOrder
				// relisted: the pool was recovered in name order, then
				// listed in the cache's order, as after a relist.
				listingRounds(b, pods, order != "relisted", func(in allocator.Input) allocator.Input {
					var podPerm, claimPerm []int
					switch order {
					case "fixed":
						podPerm, claimPerm = indexes(len(in.Pods)), indexes(len(in.Claims))
					case "cache", "relisted":
						podPerm, claimPerm = inf.perms(b, in)
					default:
						podPerm, claimPerm = rnd.Perm(len(in.Pods)), rnd.Perm(len(in.Claims))
					}
					in = cacheList(in, podPerm, claimPerm)
					runtime.GC()
					return in
				})
			})
		}
	})
}

// informerOrder gives a bench listing the order of an informer's cache:
// one allocator.CacheOrder for the pods and one for the claims (a cache's
// two informers).
type informerOrder struct {
	first        *corev1.Pod // the listing's first pod: a new one means a new pool
	pods, claims *allocator.CacheOrder
	claimsAdded  int
}

// perms returns the cache's order of in's pods and of its claims, as
// places in in, adding what in has that the caches have not yet (the
// claims a benchmark made since).
func (o *informerOrder) perms(b *testing.B, in allocator.Input) ([]int, []int) {
	if len(in.Pods) > 0 && o.first != &in.Pods[0] {
		*o = informerOrder{first: &in.Pods[0], pods: allocator.NewCacheOrder(), claims: allocator.NewCacheOrder()}
		for j := range in.Pods {
			if err := o.pods.Add(&in.Pods[j], j); err != nil {
				b.Fatal(err)
			}
		}
	}
	for ; o.claimsAdded < len(in.Claims); o.claimsAdded++ {
		if err := o.claims.Add(in.Claims[o.claimsAdded].Object, o.claimsAdded); err != nil {
			b.Fatal(err)
		}
	}
	podPerm, err := o.pods.Order(in.Pool.Namespace)
	if err != nil {
		b.Fatal(err)
	}
	claimPerm, err := o.claims.Order(in.Pool.Namespace)
	if err != nil {
		b.Fatal(err)
	}
	return podPerm, claimPerm
}

// cacheList copies the listing from as a cache's List does, every object
// deep-copied into a fresh list, pod k from from.Pods[podPerm[k]] and
// claim k from from.Claims[claimPerm[k]].
func cacheList(from allocator.Input, podPerm, claimPerm []int) allocator.Input {
	in := allocator.Input{Pool: from.Pool, Pods: make([]corev1.Pod, len(from.Pods)), Claims: make([]allocator.Claim, len(from.Claims))}
	for k, j := range podPerm {
		from.Pods[j].DeepCopyInto(&in.Pods[k])
	}
	items := make([]testenv.Claim, len(from.Claims))
	for k, j := range claimPerm {
		from.Claims[j].Object.(*testenv.Claim).DeepCopyInto(&items[k])
		in.Claims[k] = from.Claims[j]
		in.Claims[k].Object = &items[k]
	}
	return in
}

// roundBench measures one round with one new claim of per pods, given as a
// change (Update): the state of an operator that follows the pool through
// informer events.
func roundBench(b *testing.B, pods, per int, opts ...allocator.Option) {
	placedRoundBench(b, pods, per, nil, opts...)
}

// placedRoundBench is roundBench with claims placed by place.
func placedRoundBench(b *testing.B, pods, per int, place func(k int) algorithm.Placement, opts ...allocator.Option) {
	var bp *benchPool
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if bp == nil || bp.free < bp.per {
			bp = newBenchPoolPlaced(b, pods, per, pods*8/10, place, opts...)
		}
		cl := bp.addClaim(b)
		bp.free -= bp.per
		b.StartTimer()
		res, err := bp.a.Update(context.Background(), allocator.Changes{Pool: bp.pool, Claims: []allocator.Claim{cl}})
		if err != nil || len(res.Allocated) != 1 {
			b.Fatalf("round: %v, %d grants", err, len(res.Allocated))
		}
	}
}

// BenchmarkRound is one full round (plan and commit through the fake
// client) on a steady pool, 80% held by single-pod claims, with one new
// single-pod claim.
func BenchmarkRound(b *testing.B) {
	benchSizes(b, func(b *testing.B, pods int) { roundBench(b, pods, 1) })
}

// BenchmarkRoundPlaced is BenchmarkRound with placement: the pods are of
// 10 classes (a label) in 3 zones, and every claim selects one class and
// spreads over the zones.
func BenchmarkRoundPlaced(b *testing.B) {
	benchSizes(b, func(b *testing.B, pods int) { placedRoundBench(b, pods, 1, spreadPlacement) })
}

// BenchmarkGangFill fills the last 20% of a 10,000-pod pool with gang
// claims of 8 pods, one claim per Update, and reports claims served per
// second.
func BenchmarkGangFill(b *testing.B) {
	const pods, per = 10000, 8
	b.ReportAllocs()
	claims := 0
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		bp := newBenchPoolPlaced(b, pods, per, pods*8/10, gangPlacement)
		b.StartTimer()
		for bp.free >= per {
			cl := bp.addClaim(b)
			res, err := bp.a.Update(context.Background(), allocator.Changes{Pool: bp.pool, Claims: []allocator.Claim{cl}})
			if err != nil || len(res.Allocated) != 1 || len(res.Allocated[0].Pods) != per {
				b.Fatalf("round: %v, grants %v", err, res.Allocated)
			}
			bp.free -= per
			claims++
		}
	}
	b.ReportMetric(float64(claims)/b.Elapsed().Seconds(), "claims/s")
}

// BenchmarkRoundChecked is BenchmarkRound with WithInvariantChecks: the
// cost of the pool's self-check after every call.
func BenchmarkRoundChecked(b *testing.B) {
	benchSizes(b, func(b *testing.B, pods int) { roundBench(b, pods, 1, allocator.WithInvariantChecks(true)) })
}

// BenchmarkRound10 is BenchmarkRound with 10-pod claims.
func BenchmarkRound10(b *testing.B) {
	benchSizes(b, func(b *testing.B, pods int) { roundBench(b, pods, 10) })
}

// BenchmarkRecover is a restart: a new allocator's first round rebuilds a
// pool of 10,000 single-pod claims (12,500 pods) from their records.
func BenchmarkRecover(b *testing.B) {
	b.Run("claims=10000", func(b *testing.B) {
		bp := newBenchPool(b, 12500, 1)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			a, err := allocator.New(bp.c, benchOpts...)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := a.Round(context.Background(), bp.in); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// emptyClient is a fake API server with nothing on it.
func emptyClient(b *testing.B) client.Client {
	b.Helper()
	scheme, err := testenv.NewScheme()
	if err != nil {
		b.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(scheme).Build()
}

// BenchmarkRecoverListing is a restart on a listing as an operator's cache
// hands it over (cacheListing): a new allocator's first Round rebuilds a
// pool of 12,500 pods, 10,000 of them held by single-pod claims, from
// their records and, with marks, the pods' marks. The listing is built
// once, outside the timing. Run it with -cpu 1,2 to see what the
// recovery's parallel decoding gains.
func BenchmarkRecoverListing(b *testing.B) {
	for _, marks := range []bool{true, false} {
		b.Run("marks="+strconv.FormatBool(marks), func(b *testing.B) {
			c := emptyClient(b)
			opts := []allocator.Option{allocator.WithInvariantChecks(false)}
			if !marks {
				opts = append(opts, allocator.WithPodMarks(false))
			}
			const pods, claims = 12500, 10000
			in := cacheListing(marks, pods, claims)
			b.ReportAllocs()
			for b.Loop() {
				a, err := allocator.New(c, opts...)
				if err != nil {
					b.Fatal(err)
				}
				res, err := a.Round(context.Background(), in)
				if err != nil || len(res.Allocated) != 0 || len(res.Warnings) != 0 || res.IdleCount != pods-claims {
					b.Fatalf("recover: %v, %d grants, warnings %v, %d idle", err, len(res.Allocated), res.Warnings, res.IdleCount)
				}
			}
		})
	}
}

// BenchmarkFill fills an empty 10,000-pod pool one single-pod claim per
// round (Update) and reports claims/s.
func BenchmarkFill(b *testing.B) {
	const pods = 10000
	b.ReportAllocs()
	claims := 0
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		bp := newBenchPoolHeld(b, pods, 1, 0)
		b.StartTimer()
		for range pods {
			cl := bp.addClaim(b)
			res, err := bp.a.Update(context.Background(), allocator.Changes{Pool: bp.pool, Claims: []allocator.Claim{cl}})
			if err != nil || len(res.Allocated) != 1 {
				b.Fatalf("round: %v, %d grants", err, len(res.Allocated))
			}
			claims++
		}
	}
	b.ReportMetric(float64(claims)/b.Elapsed().Seconds(), "claims/s")
}

// memSyncer is an AllocationSyncer that keeps writes in the object it
// returns and sends nothing anywhere: BenchmarkRoundNoServer uses it to
// measure the allocator's own share of a round, without a (fake) server.
type memSyncer struct {
	syncer.AllocationSyncer // Read and HasFinalizer: the real annotation codec
	rv                      int
}

func (m *memSyncer) Write(_ context.Context, claim client.Object, rec syncer.Record, fin bool) (client.Object, error) {
	keys := syncer.DefaultKeys()
	out := claim.DeepCopyObject().(client.Object)
	v, err := syncer.EncodePods(rec.Allocated)
	if err != nil {
		return nil, err
	}
	ann := map[string]string{keys.Allocated: v}
	out.SetAnnotations(ann)
	if fin {
		out.SetFinalizers([]string{keys.Finalizer})
	}
	m.rv++
	out.SetResourceVersion("m" + strconv.Itoa(m.rv))
	return out, nil
}

func (m *memSyncer) Get(_ context.Context, claim client.Object) (client.Object, error) {
	return claim, nil
}

// BenchmarkRoundNoServer is BenchmarkRound with writes kept in memory: the
// allocator's and the record codec's own time and allocations per round.
func BenchmarkRoundNoServer(b *testing.B) {
	benchSizes(b, func(b *testing.B, pods int) {
		var bp *benchPool
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			if bp == nil || bp.free < 1 {
				bp = newBenchPool(b, pods, 1)
				real, err := syncer.NewAnnotationSyncer(bp.c, syncer.DefaultKeys())
				if err != nil {
					b.Fatal(err)
				}
				bp.a, err = allocator.New(nil, allocator.WithPodMarks(false), allocator.WithInvariantChecks(false), allocator.WithSyncer(&memSyncer{AllocationSyncer: real}))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := bp.a.Round(context.Background(), bp.in); err != nil {
					b.Fatal(err)
				}
			}
			cl := bp.newClaim()
			bp.free--
			b.StartTimer()
			res, err := bp.a.Update(context.Background(), allocator.Changes{Pool: bp.pool, Claims: []allocator.Claim{{Object: cl, Want: 1}}})
			if err != nil || len(res.Allocated) != 1 {
				b.Fatalf("round: %v, %d grants", err, len(res.Allocated))
			}
		}
	})
}

// heapPool is the pool BenchmarkHeap recovers: heapPods Ready pods, the
// first heapClaims of them held by one single-pod claim each, with
// realistic names and UIDs. With marks, every held pod carries its mark.
const (
	heapPods   = 50_000
	heapClaims = 40_000
)

// heapInput builds heapPool's listing as an operator's cache would hand it
// over: every pod and claim a separate object, decoded strings not shared.
func heapInput(marks bool, claims int) allocator.Input {
	return cacheListing(marks, heapPods, claims)
}

// cacheListing is a listing of pods Ready pods, the first claims of them
// held by one single-pod claim each, as heapInput describes.
func cacheListing(marks bool, pods, claims int) allocator.Input {
	const ns = "heap"
	keys := syncer.DefaultKeys()
	in := allocator.Input{Pool: types.NamespacedName{Namespace: ns, Name: "p"}}
	in.Pods = make([]corev1.Pod, pods)
	for i := range in.Pods {
		pod := readyPod(ns, fmt.Sprintf("pool-7d9f8c6b5-%05d", i))
		pod.UID = types.UID(fmt.Sprintf("0a1b2c3d-0000-4000-8000-%012d", i))
		pod.ResourceVersion = strconv.Itoa(1000 + i)
		pod.Spec.NodeName = fmt.Sprintf("node-%03d", i%500)
		pod.Labels = map[string]string{corev1.LabelTopologyZone: fmt.Sprintf("zone-%c", 'a'+i%3)}
		in.Pods[i] = pod
	}
	for i := range claims {
		name := fmt.Sprintf("claim-%05d", i)
		cl := testenv.NewClaim(ns, name, "p", 1)
		cl.UID = types.UID(fmt.Sprintf("6f1c2a3e-0000-4000-8000-%012d", i))
		cl.ResourceVersion = strconv.Itoa(100000 + i)
		cl.CreationTimestamp = metav1.NewTime(time.Unix(int64(i), 0))
		pod := in.Pods[i].Name
		v, err := syncer.EncodePods([]string{pod})
		if err != nil {
			panic(err)
		}
		cl.Annotations = map[string]string{keys.Allocated: v}
		cl.Finalizers = []string{keys.Finalizer}
		if marks {
			in.Pods[i].Annotations = map[string]string{allocator.DefaultPodMarkKey: name + "/" + string(cl.UID)}
		}
		in.Claims = append(in.Claims, allocator.Claim{Object: cl, Want: 1})
	}
	return in
}

// heapOf returns the live heap, in bytes, that a new allocator keeps after
// recovering a pool from heapInput(marks, claims): everything it holds,
// including what it keeps of the listing, which is dropped before the
// measurement; with keepListing, only what it adds to the listing, which
// stays alive throughout.
func heapOf(b *testing.B, c client.Client, marks bool, claims int, keepListing bool) float64 {
	b.Helper()
	opts := []allocator.Option{allocator.WithPodMarks(false)}
	if marks {
		opts = nil
	}
	var kept allocator.Input
	if keepListing {
		kept = heapInput(marks, claims)
	}
	var before, after runtime.MemStats
	// Twice: what sync.Pools hold survives one collection.
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&before)
	a, err := allocator.New(c, append(opts, allocator.WithInvariantChecks(false))...)
	if err != nil {
		b.Fatal(err)
	}
	func() {
		in := kept
		if !keepListing {
			in = heapInput(marks, claims)
		}
		res, err := a.Round(context.Background(), in)
		if err != nil || len(res.Allocated) != 0 || res.IdleCount != heapPods-claims || res.Shortfall != 0 {
			b.Fatalf("recover: %v, %d grants, %d idle, shortfall %d", err, len(res.Allocated), res.IdleCount, res.Shortfall)
		}
	}()
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(a)
	runtime.KeepAlive(kept)
	return float64(after.HeapAlloc) - float64(before.HeapAlloc)
}

// BenchmarkHeap reports the heap an allocator keeps for a recovered pool
// of 50,000 pods, 40,000 of them held by 40,000 single-pod claims: in all
// (MiB), per pod for the pool without claims (B/pod), and per claim for
// what the claims add (B/claim). What the allocator keeps of the listing
// counts; the listing itself does not. MiB-beyond-listing is the heap the
// allocator adds while the caller keeps the listing alive, as an informer
// cache does: strings it shares with the listing then cost nothing more.
// Run it with
//
//	go test ./allocator -run '^$' -bench Heap -benchtime 1x
func BenchmarkHeap(b *testing.B) {
	for _, marks := range []bool{true, false} {
		b.Run("marks="+strconv.FormatBool(marks), func(b *testing.B) {
			c := emptyClient(b)
			var pods, all, beyond float64
			for range b.N {
				pods = heapOf(b, c, marks, 0, false)
				all = heapOf(b, c, marks, heapClaims, false)
				beyond = heapOf(b, c, marks, heapClaims, true)
			}
			b.ReportMetric(all/(1<<20), "MiB")
			b.ReportMetric(beyond/(1<<20), "MiB-beyond-listing")
			b.ReportMetric(pods/heapPods, "B/pod")
			b.ReportMetric((all-pods)/heapClaims, "B/claim")
		})
	}
}
