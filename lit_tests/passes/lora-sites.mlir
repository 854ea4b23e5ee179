// RUN: stageml-opt %s -p bt-annotate,bt-propagate,lora-sites --max-rank 8 --stage 'fc.base_layer.weight=static' | filecheck %s
// RUN: not stageml-opt %s -p bt-annotate,bt-propagate,lora-sites --max-rank 2 --stage 'fc.base_layer.weight=static' 2>&1 | filecheck %s --check-prefix=RANK

// PEFT's LoRA linear, x@W^T + 2.0*(x@A^T)@B^T with rank 4, becomes the
// canonical site: the factors are padded to rank 8 (the arguments' types
// change) and the scaling is gone (each adapter's B comes pre-scaled).

// CHECK-LABEL: func.func @main
// CHECK-SAME:    %arg1: !torch.vtensor<[8,64],f32> {bt.name = "fc.lora_A.default.weight", bt.time = #bt.time<"adapter">}
// CHECK-SAME:    %arg2: !torch.vtensor<[48,8],f32> {bt.name = "fc.lora_B.default.weight", bt.time = #bt.time<"adapter">}
// CHECK-NOT:     torch.aten.mul.Scalar
// CHECK:         %[[WT:[0-9]+]] = torch.aten.transpose.int %arg0, {{.*}} -> !torch.vtensor<[64,48],f32>
// CHECK:         %[[AT:[0-9]+]] = torch.aten.transpose.int %arg1, {{.*}} {bt.time = #bt.time<"adapter">} : {{.*}} -> !torch.vtensor<[64,8],f32>
// CHECK-NEXT:    %[[BT:[0-9]+]] = torch.aten.transpose.int %arg2, {{.*}} {bt.time = #bt.time<"adapter">} : {{.*}} -> !torch.vtensor<[8,48],f32>
// CHECK-NEXT:    %[[Y:[0-9]+]] = torch.aten.matmul %arg3, %[[WT]] {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT:    %[[T:[0-9]+]] = torch.aten.matmul %arg3, %[[AT]] {bt.time = #bt.time<"dynamic">} : {{.*}} -> !torch.vtensor<[?,8],f32>
// CHECK-NEXT:    %[[U:[0-9]+]] = torch.aten.matmul %[[T]], %[[BT]] {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT:    %[[Z:[0-9]+]] = torch.aten.add.Tensor %[[Y]], %[[U]], %{{.*}} {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT:    return %[[Z]]
// CHECK-NOT:     torch.aten.mul.Scalar

// RANK: stageml-opt: error: LoRA factor 'fc.lora_A.default.weight' has rank 4, above the maximum rank 2: compile with a max rank of at least 4
func.func @main(%arg0: !torch.vtensor<[48,64],f32> {bt.name = "fc.base_layer.weight"}, %arg1: !torch.vtensor<[4,64],f32> {bt.name = "fc.lora_A.default.weight"}, %arg2: !torch.vtensor<[48,4],f32> {bt.name = "fc.lora_B.default.weight"}, %arg3: !torch.vtensor<[?,64],f32> {bt.name = "x"}) -> !torch.vtensor<[?,48],f32> {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %float2 = torch.constant.float 2.000000e+00
  %0 = torch.aten.transpose.int %arg0, %int0, %int1 : !torch.vtensor<[48,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[64,48],f32>
  %1 = torch.aten.matmul %arg3, %0 : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,48],f32> -> !torch.vtensor<[?,48],f32>
  %2 = torch.aten.transpose.int %arg1, %int0, %int1 : !torch.vtensor<[4,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[64,4],f32>
  %3 = torch.aten.matmul %arg3, %2 : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,4],f32> -> !torch.vtensor<[?,4],f32>
  %4 = torch.aten.transpose.int %arg2, %int0, %int1 : !torch.vtensor<[48,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,48],f32>
  %5 = torch.aten.matmul %3, %4 : !torch.vtensor<[?,4],f32>, !torch.vtensor<[4,48],f32> -> !torch.vtensor<[?,48],f32>
  %6 = torch.aten.mul.Scalar %5, %float2 : !torch.vtensor<[?,48],f32>, !torch.float -> !torch.vtensor<[?,48],f32>
  %7 = torch.aten.add.Tensor %1, %6, %int1 : !torch.vtensor<[?,48],f32>, !torch.vtensor<[?,48],f32>, !torch.int -> !torch.vtensor<[?,48],f32>
  return %7 : !torch.vtensor<[?,48],f32>
}
