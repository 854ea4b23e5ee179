// RUN: stageml-opt %s -p lora-sites{max-rank=4,max-adapters=2} | filecheck %s

// A half-precision expert site: PEFT merges an f16 expert stack in float32 (W and
// the factors cast up, the sum cast back to f16). The same site as in
// lora-sites-experts.mlir, rebuilt in f16: no float32 merge is left.

// CHECK:       module attributes {bt.sites = [{dtype = "float16", experts = 4 : i64, in_features = 6 : i64, lora_A = "experts.lora_A.default.weight", lora_B = "experts.lora_B.default.weight", out_features = 12 : i64, parameter = "experts.gate_up_proj", rank = 2 : i64, scaling = 2.000000e+00 : f64}]
// CHECK-LABEL: func.func @main
// CHECK-SAME:    %arg1: !torch.vtensor<[16,6],f16> {bt.name = "experts.lora_A.default.weight"
// CHECK-SAME:    %arg2: !torch.vtensor<[12,16],f16> {bt.name = "experts.lora_B.default.weight"
// CHECK-NOT:     f32
// CHECK:         %[[A:[0-9]+]] = torch.aten.view %arg1, %{{[0-9]+}} {bt.time = #bt.time<"adapter">} : !torch.vtensor<[16,6],f16>, !torch.list<int> -> !torch.vtensor<[4,4,6],f16>
// CHECK:         %[[B3:[0-9]+]] = torch.aten.view %arg2, %{{[0-9]+}} {bt.time = #bt.time<"adapter">} : !torch.vtensor<[12,16],f16>, !torch.list<int> -> !torch.vtensor<[12,4,4],f16>
// CHECK:         %[[B:[0-9]+]] = torch.aten.permute %[[B3]], {{.*}} -> !torch.vtensor<[4,12,4],f16>
// CHECK:         %[[D:[0-9]+]] = torch.aten.bmm %[[B]], %[[A]] {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,4],f16>, !torch.vtensor<[4,4,6],f16> -> !torch.vtensor<[4,12,6],f16>
// CHECK-NOT:     torch.aten.to.dtype
// CHECK:         %[[M:[0-9]+]] = torch.aten.add.Tensor %arg0, %[[D]], %{{.*}} {bt.time = #bt.time<"adapter">}
// CHECK:         torch.aten.permute %[[M]]
// CHECK:         torch.aten.index_select
// CHECK:         torch.aten.bmm %arg3
module {
  func.func @main(%arg0: !torch.vtensor<[4,12,6],f16> {bt.name = "experts.gate_up_proj", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[8,6],f16> {bt.name = "experts.lora_A.default.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[12,8],f16> {bt.name = "experts.lora_B.default.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[?,1,6],f16> {bt.name = "x", bt.time = #bt.time<"dynamic">}, %arg4: !torch.vtensor<[?],si64> {bt.name = "expert_ids", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,1,12],f16> attributes {bt.program = "main"} {
    %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %int2 = torch.constant.int 2 {bt.time = #bt.time<"static">}
    %int4 = torch.constant.int 4 {bt.time = #bt.time<"static">}
    %int5 = torch.constant.int 5 {bt.time = #bt.time<"static">}
    %int6 = torch.constant.int 6 {bt.time = #bt.time<"static">}
    %int12 = torch.constant.int 12 {bt.time = #bt.time<"static">}
    %int-1 = torch.constant.int -1 {bt.time = #bt.time<"static">}
    %false = torch.constant.bool false {bt.time = #bt.time<"static">}
    %none = torch.constant.none {bt.time = #bt.time<"static">}
    %float2 = torch.constant.float 2.000000e+00 {bt.time = #bt.time<"static">}
    %0 = torch.prim.ListConstruct %int4, %int-1, %int6 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %1 = torch.aten.view %arg1, %0 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,6],f16>, !torch.list<int> -> !torch.vtensor<[4,2,6],f16>
    %2 = torch.prim.ListConstruct %int12, %int-1, %int4 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %3 = torch.aten.view %arg2, %2 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[12,8],f16>, !torch.list<int> -> !torch.vtensor<[12,2,4],f16>
    %4 = torch.prim.ListConstruct %int2, %int0, %int1 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %5 = torch.aten.permute %3, %4 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[12,2,4],f16>, !torch.list<int> -> !torch.vtensor<[4,12,2],f16>
    %6 = torch.aten.to.dtype %arg0, %int6, %false, %false, %none {bt.time = #bt.time<"static">} : !torch.vtensor<[4,12,6],f16>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[4,12,6],f32>
    %7 = torch.aten.to.dtype %5, %int6, %false, %false, %none {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,2],f16>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[4,12,2],f32>
    %8 = torch.aten.to.dtype %1, %int6, %false, %false, %none {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,2,6],f16>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[4,2,6],f32>
    %9 = torch.aten.bmm %7, %8 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,2],f32>, !torch.vtensor<[4,2,6],f32> -> !torch.vtensor<[4,12,6],f32>
    %10 = torch.aten.mul.Scalar %9, %float2 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,6],f32>, !torch.float -> !torch.vtensor<[4,12,6],f32>
    %11 = torch.aten.add.Tensor %6, %10, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,6],f32>, !torch.vtensor<[4,12,6],f32>, !torch.int -> !torch.vtensor<[4,12,6],f32>
    %12 = torch.aten.to.dtype %11, %int5, %false, %false, %none {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,6],f32>, !torch.int, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[4,12,6],f16>
    %13 = torch.prim.ListConstruct %int0, %int2, %int1 {bt.time = #bt.time<"static">} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
    %14 = torch.aten.permute %12, %13 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,12,6],f16>, !torch.list<int> -> !torch.vtensor<[4,6,12],f16>
    %15 = torch.aten.index_select %14, %int0, %arg4 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[4,6,12],f16>, !torch.int, !torch.vtensor<[?],si64> -> !torch.vtensor<[?,6,12],f16>
    %16 = torch.aten.bmm %arg3, %15 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,6],f16>, !torch.vtensor<[?,6,12],f16> -> !torch.vtensor<[?,1,12],f16>
    return %16 : !torch.vtensor<[?,1,12],f16>
  }
}
