bash benchmarks/device_run.sh build >/dev/null 2>&1; grep build "$OUT/summary.txt"
export PYTHONPATH=$PWD/python
for spec in "b1_l8k legacy" "b1_l8k w8s2" "swa128_b64 legacy" "swa128_b64 w4s3"; do
  set -- $spec
  timeout 60 ncu --clock-control none -k regex:decode_attention -s 20 -c 1 --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy python3 benchmarks/ncu_row.py $1 $2 > $OUT/ncu_$1_$2.txt 2>&1
  echo "== $spec"; grep -vE "^(==PROF==|    ---|$)" $OUT/ncu_$1_$2.txt | grep -E "Duration|Throughput|Registers|Shared Memory Config|Dynamic Shared|Occupancy|Block Limit|Cycles Per Issued|Grid Size|Waves|Elapsed|Active Warps|Eligible|Issued Warp|No Eligible|decode_attention" | head -28
done
