// RUN: stageml-opt %s -p defer-dequant | filecheck %s
// RUN: stageml-opt %s -p defer-dequant,bt-verify | filecheck %s

// On bt-improve's output for a quantized base (compiler/quantized.py's export
// form): each int8 weight's transpose and widening cast are static. The cast
// takes the earliest time of its users, marked bt.deferred; its transpose
// stays static (folded in int8):
//   %3: read by a request-time product         -> dynamic
//   %7: read by an adapter-time merge (W*v + s*A@B) -> adapter
// Left alone: a float-to-float cast, a narrowing integer cast (si64 -> f32 is
// no wider) and a cast whose users are static too. bt-verify accepts the
// deferred casts' recomputation (second RUN).

// CHECK-LABEL: func.func @main
// CHECK:      %[[T:[0-9]+]] = torch.aten.permute %arg0, %{{[0-9]+}} {bt.time = #bt.time<"static">} : !torch.vtensor<[16,8],si8>
// CHECK-NEXT: %[[W:[0-9]+]] = torch.aten.to.dtype %[[T]], %int6, %false, %false, %none {bt.deferred, bt.time = #bt.time<"dynamic">} : !torch.vtensor<[8,16],si8>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[8,16],f32>
// CHECK-NEXT: torch.aten.matmul %arg5, %[[W]] {bt.time = #bt.time<"dynamic">}
// CHECK:      %[[T2:[0-9]+]] = torch.aten.permute %arg2, %{{[0-9]+}} {bt.time = #bt.time<"static">}
// CHECK-NEXT: %[[W2:[0-9]+]] = torch.aten.to.dtype %[[T2]], %int6, %false, %false, %none {bt.deferred, bt.time = #bt.time<"adapter">}
// CHECK-NEXT: torch.aten.mul.Tensor %[[W2]], %arg3 {bt.time = #bt.time<"adapter">}
// CHECK:      torch.aten.to.dtype %arg6, %int6, %false, %false, %none {bt.time = #bt.time<"static">} : !torch.vtensor<[4],si64>
// CHECK:      torch.aten.to.dtype %arg7, %int6, %false, %false, %none {bt.time = #bt.time<"static">} : !torch.vtensor<[8],f16>
// CHECK:      torch.aten.to.dtype %arg8, %int6, %false, %false, %none {bt.time = #bt.time<"static">} : !torch.vtensor<[8],si8>
// CHECK-NOT:  bt.deferred
func.func @main(%arg0: !torch.vtensor<[16,8],si8> {bt.name = "fc.weight.qdata", bt.time = #bt.time<"static">},
                %arg1: !torch.vtensor<[16],f32> {bt.name = "fc.weight.scale", bt.time = #bt.time<"static">},
                %arg2: !torch.vtensor<[16,8],si8> {bt.name = "up.weight.qdata", bt.time = #bt.time<"static">},
                %arg3: !torch.vtensor<[16],f32> {bt.name = "up.weight.scale", bt.time = #bt.time<"static">},
                %arg4: !torch.vtensor<[8,16],f32> {bt.name = "up.delta", bt.time = #bt.time<"adapter">},
                %arg5: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">},
                %arg6: !torch.vtensor<[4],si64> {bt.name = "positions", bt.time = #bt.time<"static">},
                %arg7: !torch.vtensor<[8],f16> {bt.name = "norm.weight", bt.time = #bt.time<"static">},
                %arg8: !torch.vtensor<[8],si8> {bt.name = "codes", bt.time = #bt.time<"static">},
                %arg9: !torch.vtensor<[4],f32> {bt.name = "h", bt.time = #bt.time<"dynamic">},
                %arg10: !torch.vtensor<[8],f32> {bt.name = "g", bt.time = #bt.time<"dynamic">})
    -> (!torch.vtensor<[?,16],f32>, !torch.vtensor<[?,16],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[8],f32>, !torch.vtensor<[8],f32>) attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %int6 = torch.constant.int 6 {bt.time = #bt.time<"static">}
  %false = torch.constant.bool false {bt.time = #bt.time<"static">}
  %none = torch.constant.none {bt.time = #bt.time<"static">}
  %0 = torch.prim.ListConstruct %int1, %int0 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int) -> !torch.list<int>
  %2 = torch.aten.permute %arg0, %0 {bt.time = #bt.time<"static">} : !torch.vtensor<[16,8],si8>, !torch.list<int> -> !torch.vtensor<[8,16],si8>
  %3 = torch.aten.to.dtype %2, %int6, %false, %false, %none {bt.time = #bt.time<"static">} : !torch.vtensor<[8,16],si8>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[8,16],f32>
  %4 = torch.aten.matmul %arg5, %3 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,16],f32> -> !torch.vtensor<[?,16],f32>
  %5 = torch.aten.mul.Tensor %4, %arg1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,16],f32>, !torch.vtensor<[16],f32> -> !torch.vtensor<[?,16],f32>
  %6 = torch.aten.permute %arg2, %0 {bt.time = #bt.time<"static">} : !torch.vtensor<[16,8],si8>, !torch.list<int> -> !torch.vtensor<[8,16],si8>
  %7 = torch.aten.to.dtype %6, %int6, %false, %false, %none {bt.time = #bt.time<"static">} : !torch.vtensor<[8,16],si8>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[8,16],f32>
  %8 = torch.aten.mul.Tensor %7, %arg3 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,16],f32>, !torch.vtensor<[16],f32> -> !torch.vtensor<[8,16],f32>
  %9 = torch.aten.add.Tensor %8, %arg4, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,16],f32>, !torch.vtensor<[8,16],f32>, !torch.int -> !torch.vtensor<[8,16],f32>
  %10 = torch.aten.matmul %arg5, %9 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,16],f32> -> !torch.vtensor<[?,16],f32>
  %11 = torch.aten.to.dtype %arg6, %int6, %false, %false, %none {bt.time = #bt.time<"static">} : !torch.vtensor<[4],si64>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[4],f32>
  %12 = torch.aten.mul.Tensor %11, %arg9 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %13 = torch.aten.to.dtype %arg7, %int6, %false, %false, %none {bt.time = #bt.time<"static">} : !torch.vtensor<[8],f16>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[8],f32>
  %14 = torch.aten.mul.Tensor %13, %arg10 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[8],f32>, !torch.vtensor<[8],f32> -> !torch.vtensor<[8],f32>
  %15 = torch.aten.to.dtype %arg8, %int6, %false, %false, %none {bt.time = #bt.time<"static">} : !torch.vtensor<[8],si8>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[8],f32>
  %16 = torch.aten.mul.Tensor %15, %15 {bt.time = #bt.time<"static">} : !torch.vtensor<[8],f32>, !torch.vtensor<[8],f32> -> !torch.vtensor<[8],f32>
  return %5, %10, %12, %14, %16 : !torch.vtensor<[?,16],f32>, !torch.vtensor<[?,16],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[8],f32>, !torch.vtensor<[8],f32>
}
