// RUN: stageml-opt %s -p 'lora-sites{max-rank=8,max-adapters=4}' | filecheck %s

// lora-sites-parameter.mlir's router LoRA in f16: PEFT computes the delta of a
// half-precision parameter in float32 (the factors cast up, s*(B@A) cast back)
// and adds it to W. The same dense site, in f16; no float32 is left.

// CHECK:         module attributes {
// CHECK-SAME:      bt.sites = [{dtype = "float16", experts = 0 : i64, in_features = 64 : i64, lora_A = "mlp.gate.lora_A.default.weight", lora_B = "mlp.gate.lora_B.default.weight", out_features = 6 : i64, rank = 2 : i64, scaling = 2.000000e+00 : f64}]
// CHECK-LABEL: func.func @main
// CHECK-SAME:    %arg1: !torch.vtensor<[8,64],f16> {bt.name = "mlp.gate.lora_A.default.weight", bt.time = #bt.time<"adapter">}
// CHECK-SAME:    %arg2: !torch.vtensor<[6,8],f16> {bt.name = "mlp.gate.lora_B.default.weight", bt.time = #bt.time<"adapter">}
// CHECK-NOT:     f32
// CHECK:         %[[X:[0-9]+]] = torch.aten.view %arg3
// CHECK:         %[[WT:[0-9]+]] = torch.aten.transpose.int %arg0, {{.*}} {bt.time = #bt.time<"static">} : {{.*}} -> !torch.vtensor<[64,6],f16>
// CHECK:         %[[AT:[0-9]+]] = torch.aten.transpose.int %arg1, {{.*}} -> !torch.vtensor<[64,8],f16>
// CHECK-NEXT:    %[[BT:[0-9]+]] = torch.aten.transpose.int %arg2, {{.*}} -> !torch.vtensor<[8,6],f16>
// CHECK-NEXT:    %[[Y:[0-9]+]] = torch.aten.matmul %[[X]], %[[WT]] {bt.time = #bt.time<"dynamic">} : {{.*}} -> !torch.vtensor<[?,6],f16>
// CHECK-NEXT:    %[[T:[0-9]+]] = torch.aten.matmul %[[X]], %[[AT]] {{.*}} -> !torch.vtensor<[?,8],f16>
// CHECK-NEXT:    %[[U:[0-9]+]] = torch.aten.matmul %[[T]], %[[BT]] {{.*}} -> !torch.vtensor<[?,6],f16>
// CHECK-NEXT:    %[[Z:[0-9]+]] = torch.aten.add.Tensor %[[Y]], %[[U]], %{{.*}} {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT:    return %[[Z]]
func.func @main(%arg0: !torch.vtensor<[6,64],f16> {bt.name = "mlp.gate.base_layer.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[2,64],f16> {bt.name = "mlp.gate.lora_A.default.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[6,2],f16> {bt.name = "mlp.gate.lora_B.default.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[?,?,64],f16> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,6],f16> attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %int5 = torch.constant.int 5 {bt.time = #bt.time<"static">}
  %int6 = torch.constant.int 6 {bt.time = #bt.time<"static">}
  %int-1 = torch.constant.int -1 {bt.time = #bt.time<"static">}
  %int64 = torch.constant.int 64 {bt.time = #bt.time<"static">}
  %false = torch.constant.bool false {bt.time = #bt.time<"static">}
  %none = torch.constant.none {bt.time = #bt.time<"static">}
  %float2.000000e00 = torch.constant.float 2.000000e+00 {bt.time = #bt.time<"static">}
  %0 = torch.prim.ListConstruct %int-1, %int64 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int) -> !torch.list<int>
  %1 = torch.aten.view %arg3, %0 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,?,64],f16>, !torch.list<int> -> !torch.vtensor<[?,64],f16>
  %2 = torch.aten.to.dtype %arg1, %int6, %false, %false, %none {bt.time = #bt.time<"adapter">} : !torch.vtensor<[2,64],f16>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[2,64],f32>
  %3 = torch.aten.to.dtype %arg2, %int6, %false, %false, %none {bt.time = #bt.time<"adapter">} : !torch.vtensor<[6,2],f16>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[6,2],f32>
  %4 = torch.aten.mm %3, %2 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[6,2],f32>, !torch.vtensor<[2,64],f32> -> !torch.vtensor<[6,64],f32>
  %5 = torch.aten.mul.Scalar %4, %float2.000000e00 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[6,64],f32>, !torch.float -> !torch.vtensor<[6,64],f32>
  %6 = torch.aten.to.dtype %5, %int5, %false, %false, %none {bt.time = #bt.time<"adapter">} : !torch.vtensor<[6,64],f32>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[6,64],f16>
  %7 = torch.aten.add.Tensor %arg0, %6, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[6,64],f16>, !torch.vtensor<[6,64],f16>, !torch.int -> !torch.vtensor<[6,64],f16>
  %8 = torch.aten.transpose.int %7, %int0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[6,64],f16>, !torch.int, !torch.int -> !torch.vtensor<[64,6],f16>
  %9 = torch.aten.mm %1, %8 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,64],f16>, !torch.vtensor<[64,6],f16> -> !torch.vtensor<[?,6],f16>
  return %9 : !torch.vtensor<[?,6],f16>
}
