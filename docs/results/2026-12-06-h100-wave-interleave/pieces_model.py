import numpy as np, math
def pieces(sizes, K, N, tileM, tileN, cM, cN, sm=132, light_rows=128):
    G=len(sizes); off=np.concatenate([[0],np.cumsum(sizes)])
    gr=cM*tileM; per=-(-K//gr)
    gt=cM*(-(-(-(-N//tileN))//cN)*cN); wave=sm//(cM*cN)*(cM*cN)
    seg_g=wave//math.gcd(gt,wave)
    P=G*(-(-K//128)+2)
    light=[int(s<=light_rows) for s in sizes]
    ordn=[sum(1 for h in range(g) if light[h]==light[g]) for g in range(G)]
    cnt=[light.count(0), light.count(1)]
    first={0:{},1:{}}
    for g in range(G): first[light[g]][ordn[g]]=ordn[g]*per
    mixed=cnt[0]>0 and cnt[1]>0
    gps=seg_g if mixed else G*per
    segs=[-(-cnt[0]*per//gps), -(-cnt[1]*per//gps)]
    slots=min(gps,G)
    out={}
    for g in range(G):
        m=sizes[g]; L=light[g]; f=first[L][ordn[g]]; j=f
        while j<f+per:
            seg=j//gps; end=min((seg+1)*gps, f+per)
            lo=max(o for o in range(cnt[L]) if first[L][o]<=seg*gps)
            nh,nl=segs
            pos = seg+(0 if nl==0 else seg*nl//nh) if L==0 else (0 if nh==0 else -(-(seg+1)*nh//nl))+seg
            q=pos*slots+(ordn[g]-lo)
            assert 0<=q<P, (q,P); assert q not in out, q
            k0=(j-f)*gr; k1=min((end-f)*gr,K)
            out[q]=(g,k0,k1,L, (j*gt))  # tile position in stream
            j=end
    # coverage
    cov={}
    for q,(g,k0,k1,L,_) in out.items():
        cov.setdefault(g,[]).append((k0,k1))
    for g in range(G):
        iv=sorted(cov[g]); assert iv[0][0]==0 and iv[-1][1]==K and all(a[1]==b[0] for a,b in zip(iv,iv[1:])), iv
    # linear tile order: problems in q order, tiles per piece = rows tiles * gt/cM... ; check wave alignment of kind switches
    seq=[]
    for q in sorted(out):
        g,k0,k1,L,_=out[q]; rows_tiles=-(-(k1-k0)//tileM); rows_tiles=-(-rows_tiles//cM)*cM
        seq += [L]*(rows_tiles*(gt//cM))
    switches=[i for i in range(1,len(seq)) if seq[i]!=seq[i-1]]
    mis=[i for i in switches if i%wave]
    return len(out), P, gps, segs, len(switches), len(mis)
S=[8, 83, 945, 0, 162, 4, 3, 0, 251, 510, 24, 140, 37, 0, 33, 10, 1, 0, 5, 0, 115, 0, 1, 1, 1, 188, 43, 1, 7, 0, 12, 0,324, 5, 88, 0, 0, 58, 558, 219, 1296, 1155, 2, 1102, 6, 0, 115, 0, 106, 0, 10, 0, 698, 2, 594, 221, 351, 0, 1, 2,2040, 0, 7, 743]
print("fc1", pieces(S, 2048, 2816, 128,128,1,2))
print("fc2", pieces(S, 1408, 2048, 128,256,1,2))
print("fc1 even", pieces([384]*64, 2048, 2816, 128,128,1,2))
rng=np.random.default_rng(0)
for it in range(300):
    G=int(rng.integers(1,80)); K=8*int(rng.integers(1,300)); N=8*int(rng.integers(1,300))
    sizes=list(rng.multinomial(int(rng.integers(0,5000)), rng.dirichlet(np.full(G,0.2))))
    cfg=[(128,128,1,2),(128,128,2,1),(128,256,1,2)][it%3]
    pieces(sizes,K,N,*cfg)
print("random ok")
